"""Bulk actions by filter: a plan first, then an apply that touches only what it showed.

A *plan* (DESIGN §7, docs/many-tasks.md) records the tasks a :class:`TaskFilter` matched in a
state the action applies to, each with the fencing token and state it had, the action and
its arguments, and the operator. :meth:`Bulk.apply` acts on a task only if its token and
state are still those (compare-and-set, in the statement that acts): a task a worker
claimed, wrote or ended since is reported, not touched. It goes in batches of
:data:`BATCH_SIZE` tasks, one transaction each, which also records each task's outcome; so
an apply that crashed is finished by running it again, and acts on no task twice (a signal
included).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from psycopg.types.json import Jsonb

from toolkit.counts import counted
from toolkit.definition import definition_from_body, validate_payload
from toolkit.errors import InputError, PlanRefused, UnknownSignal
from toolkit.store.bulk_redrive import RedrivePreview, apply_item, arguments_of, preview
from toolkit.store.callbacks import wake_branches_of
from toolkit.store.database import Database
from toolkit.store.descendants import ended_children
from toolkit.store.filters import TaskFilter
from toolkit.store.names import check_signal_name
from toolkit.store.redrive_plan import RedriveOptions
from toolkit.store.signal_waits import signal_waits
from toolkit.store.tasks import Tasks, check_error_name

#: Tasks acted on in one transaction: small enough that no worker's fenced commit waits long
#: for a row lock a batch holds.
BATCH_SIZE = 1000

Action = Literal["cancel", "signal", "reconcile", "redrive"]
Outcome = Literal["completed", "failed", "retry"]

#: The states each action applies to: a task matched in another is left alone.
_ACTIONABLE: Mapping[str, tuple[str, ...]] = {
    "cancel": ("queued", "leased", "waiting"),
    "signal": ("queued", "leased", "waiting"),
    "reconcile": ("waiting",),
    "redrive": ("failed", "cancelled"),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A bulk plan and how far applying it went.

    Attributes:
        id: the plan's id (``toolkit bulk apply ID``).
        action: ``cancel``, ``signal``, ``reconcile`` or ``redrive``.
        arguments: the action's arguments (reason; signal name and payload; step, outcome;
            a redrive's options and its preview, see `toolkit.store.bulk_redrive`).
        filter: the filter it was made with, as JSON (durations resolved to times).
        operator: who made it.
        created_at: when.
        finished_at: when its last task was acted on or reported; None while some are left.
        planned: tasks in the plan.
        applied: acted on.
        moved: not acted on: their fencing token or state changed since the plan.
        gone: not acted on: deleted since.
        refused: not acted on: unchanged, but the action refused them.
        matched: the tasks the filter matched, by ``(state, definition, version)``, all
            states (filled by :meth:`Bulk.plan`; empty when read back).
        planned_counts: the planned tasks by ``(state, definition, version)``.
    """

    id: int
    action: str
    arguments: dict[str, Any]
    filter: dict[str, Any]
    operator: str
    created_at: datetime.datetime
    finished_at: datetime.datetime | None
    planned: int
    applied: int
    moved: int
    gone: int
    refused: int
    matched: tuple[tuple[str, str, int, int], ...] = ()
    planned_counts: tuple[tuple[str, str, int, int], ...] = ()

    @property
    def left(self) -> int:
        """Tasks of the plan not acted on or reported yet."""
        return self.planned - self.applied - self.moved - self.gone - self.refused

    def effects(self) -> list[str]:
        """What applying the plan does, in words, one line per kind of task."""
        by_state: dict[str, int] = {}
        for state, _, _, n in self.planned_counts:
            by_state[state] = by_state.get(state, 0) + n
        lines = []
        if self.action == "cancel":
            at_once = by_state.get("queued", 0) + by_state.get("waiting", 0)
            if at_once:
                lines.append(f"cancelled at once: {counted(at_once, 'queued or waiting task')}")
            if by_state.get("leased"):
                lines.append(
                    "asked to stop at their next durable point (at once if the lease has "
                    f"expired): {counted(by_state['leased'], 'leased task')}"
                )
        elif self.action == "signal":
            name = self.arguments["name"]
            if by_state.get("waiting"):
                lines.append(
                    f"get signal {name!r}, those waiting for it wake at once: "
                    f"{counted(by_state['waiting'], 'waiting task')}"
                )
            others = by_state.get("queued", 0) + by_state.get("leased", 0)
            if others:
                lines.append(
                    f"get signal {name!r}, kept until a wait step consumes it: "
                    f"{counted(others, 'queued or leased task')}"
                )
        elif self.action == "redrive":
            lines.extend(RedrivePreview.from_json(self.arguments["preview"]).lines())
        elif self.planned:
            lines.append(
                f"recorded as {self.arguments['outcome']} and queued again: "
                f"{counted(self.planned, 'task')} waiting to reconcile step "
                f"{self.arguments['step']!r}"
            )
        planned = {(s, d, v) for s, d, v, _ in self.planned_counts}
        left_alone = sum(n for s, d, v, n in self.matched if (s, d, v) not in planned)
        if left_alone:
            why = {
                "reconcile": "not waiting for that reconciliation",
                "redrive": "not failed or cancelled",
            }.get(self.action, "ended")
            lines.append(f"left alone ({why}): {counted(left_alone, 'other matching task')}")
        return lines or ["nothing: no matching task is in a state this action applies to"]

    def summary(self) -> str:
        """The outcome so far, e.g. ``3,204 acted on, 17 moved since the plan``."""
        parts = [f"{self.applied:,} acted on"]
        if self.moved:
            parts.append(f"{self.moved:,} moved since the plan (not touched)")
        if self.gone:
            parts.append(f"{self.gone:,} deleted since the plan")
        if self.refused:
            parts.append(f"{self.refused:,} refused")
        if self.left:
            parts.append(f"{self.left:,} left")
        return ", ".join(parts)


class Bulk:
    """Plan bulk actions by filter, and apply plans."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._tasks = Tasks(db)

    async def plan_cancel(
        self, where: TaskFilter, *, reason: str = "cancelled in bulk", operator: str = "operator"
    ) -> Plan:
        """Plan cancelling the live tasks ``where`` matches (see :meth:`Tasks.cancel`).

        Raises:
            InputError: a filter field is not valid.
        """
        return await self._plan("cancel", where, {"reason": reason}, operator)

    async def plan_signal(
        self,
        where: TaskFilter,
        name: str,
        payload: Any = None,
        *,
        force: bool = False,
        operator: str = "operator",
    ) -> Plan:
        """Plan sending signal ``name`` to the live tasks ``where`` matches.

        The payload is checked now against each matched definition's schema for the signal
        (its defaults applied), and each definition must have a wait step for ``name``
        unless ``force`` — as :meth:`Tasks.signal` checks one task.

        Raises:
            InputError: a filter field, the name or the payload is not valid (nothing kept).
            UnknownSignal: a matched definition waits for no signal ``name``; the message
                names it (nothing kept).
        """
        check_signal_name(name)
        payload = self._tasks._checked(payload, f"payload of signal {name!r}")
        arguments = {"name": name, "payload": payload, "force": force}
        plan = await self._plan("signal", where, arguments, operator)
        try:
            payloads = await self._signal_payloads(plan.id, name, payload, force)
        except InputError:
            await self._db.execute("delete_bulk_plan", {"plan_id": plan.id})
            raise
        await self._db.execute(
            "set_bulk_plan_arguments",
            {"plan_id": plan.id, "arguments": Jsonb({**arguments, "payloads": payloads})},
        )
        return dataclasses.replace(plan, arguments={**arguments, "payloads": payloads})

    async def plan_reconcile(
        self,
        where: TaskFilter,
        step: str,
        outcome: Outcome,
        *,
        result: Any = None,
        error: str | None = None,
        message: str | None = None,
        operator: str = "operator",
    ) -> Plan:
        """Plan recording ``outcome`` for the uncertain effect of step ``step``.

        The plan holds every task ``where`` matches that waits for that reconciliation (see
        :meth:`Tasks.reconcile`).

        Raises:
            InputError: a filter field, the result or the error name is not valid.
        """
        if outcome not in ("completed", "failed", "retry"):
            raise InputError(f"outcome {outcome!r}: completed, failed or retry", path="outcome")
        if error is not None:
            check_error_name(error)
        if outcome == "completed":
            self._tasks._checked(result, f"result of step {step!r}")
        arguments = {
            "step": step, "outcome": outcome,
            "result": result if outcome == "completed" else None,
            "error": {
                "name": error or "ReconciledFailure",
                "message": message or "failure recorded by reconciliation",
            } if outcome == "failed" else None,
        }  # fmt: skip
        return await self._plan("reconcile", where, arguments, operator)

    async def plan_redrive(
        self,
        where: TaskFilter,
        *,
        from_step: str | None = None,
        version: int | None = None,
        rerun: Sequence[str] = (),
        timeout: float | None = None,
        reason: str | None = None,
        operator: str = "operator",
    ) -> Plan:
        """Plan redriving the failed and cancelled tasks ``where`` matches.

        Each is planned as :meth:`Tasks.redrive` plans one, with the same options, and the
        plan's preview (``plan.effects()``) sums what the redrives would do: the effects
        called again by step, those refused and why. Applying it redrives each task whose
        redrive is not refused, in a transaction of its own (`toolkit.store.bulk_redrive`).
        Planning reads every matched task's history: it takes time linear in them.

        Raises:
            InputError: a filter field is not valid.
        """
        options = RedriveOptions(from_step, frozenset(rerun), timeout, version)
        arguments = arguments_of(options, reason)
        plan = await self._plan("redrive", where, arguments, operator)
        found = await preview(self._db, plan.id, options)
        arguments["preview"] = found.to_json()
        await self._db.execute(
            "set_bulk_plan_arguments", {"plan_id": plan.id, "arguments": Jsonb(arguments)}
        )
        return dataclasses.replace(plan, arguments=arguments)

    async def _plan(
        self, action: Action, where: TaskFilter, arguments: dict[str, Any], operator: str
    ) -> Plan:
        now = await self._tasks.database_now()
        row = await self._db.fetch_one(
            "create_bulk_plan",
            {
                **where.params(now),
                "action": action,
                "arguments": Jsonb(arguments),
                "filter": Jsonb(where.to_json(now)),
                "operator": operator,
                "actionable": list(_ACTIONABLE[action]),
                "reconcile_step": arguments["step"] if action == "reconcile" else None,
            },
            prepare=False,
        )
        assert row is not None
        if not row["planned"]:  # nothing to do: the plan is done as it is made
            await self._db.execute("finish_bulk_plan", {"plan_id": row["id"]})
        plan = await self.get(int(row["id"]))
        return dataclasses.replace(plan, matched=tuple(await self._tasks.matching_counts(where)))

    async def _signal_payloads(
        self, plan_id: int, name: str, payload: Any, force: bool
    ) -> dict[str, Any]:
        """The payload for each definition digest of the plan, checked against its schema."""
        rows = await self._db.fetch_all("bulk_plan_digests", {"plan_id": plan_id})
        waits = {
            (row["digest"], f"{row['name']} v{row['version']}"): signal_waits(
                definition_from_body(row["body"]), None, name
            )
            for row in rows
            if row["body"] is not None
        }
        refusing = sorted(label for (_, label), (waited, _) in waits.items() if name not in waited)
        if refusing and not force:
            raise UnknownSignal(
                f"no wait step of {', '.join(refusing)} waits for signal {name!r}; no plan "
                "was kept (--force, or force=True, plans it anyway)"
            )
        payloads = {row["digest"]: payload for row in rows}
        for (digest, label), (_, schema) in waits.items():
            if schema is not None:
                what = f"payload of signal {name!r} for {label}"
                payloads[digest] = validate_payload(schema, payload, what)
        return payloads

    async def get(self, plan_id: int) -> Plan:
        """Read a plan and how far applying it went.

        Raises:
            PlanRefused: there is no plan ``plan_id``.
        """
        row = await self._db.fetch_one("get_bulk_plan", {"plan_id": plan_id})
        if row is None:
            raise PlanRefused(f"there is no bulk plan {plan_id}")
        counts = await self._db.fetch_all("bulk_plan_counts", {"plan_id": plan_id})
        planned_counts = tuple(
            (r["state"], r["definition_name"], r["definition_version"], int(r["n"]))
            for r in counts
        )
        return Plan(**{**row, "planned_counts": planned_counts})

    async def not_acted_on(self, plan_id: int, limit: int = 20) -> list[dict[str, Any]]:
        """The plan's tasks that were not acted on (moved, gone, refused), at most ``limit``.

        Each with its state and token as planned and as they are now, and the ``reason``
        of one refused (a redrive's), else None.
        """
        rows = await self._db.fetch_all("bulk_plan_moved", {"plan_id": plan_id, "limit": limit})
        return [dict(row) for row in rows]

    async def apply(
        self,
        plan_id: int,
        *,
        batch_size: int = BATCH_SIZE,
        progress: Callable[[int], None] | None = None,
    ) -> Plan:
        """Carry a plan out, or finish an apply that stopped half-way.

        Each batch is one statement per tenant of its tasks (on a store distributed by
        tenant, each on the tenant's shard): it locks the batch's plan items and those of
        its tasks whose fencing token and state are still what the plan recorded, acts on
        those, and records every item's outcome. Cancelled tasks' live children are then
        cancelled too (as ``toolkit cancel`` does).

        Args:
            plan_id: the plan.
            batch_size: tasks a transaction.
            progress: called after each batch with the number of tasks it settled.

        Returns:
            The plan as applying it left it.

        Raises:
            PlanRefused: no such plan, or it was applied already (the message says when and
                with what outcome).
        """
        plan = await self.get(plan_id)
        if plan.finished_at is not None:
            raise PlanRefused(
                f"bulk plan {plan_id} was applied already, finished "
                f"{plan.finished_at:%Y-%m-%d %H:%M:%S %Z}: {plan.summary()}"
            )
        while items := await self._db.fetch_all(
            "bulk_open_items", {"plan_id": plan_id, "limit": batch_size}
        ):
            if plan.action == "redrive":  # a task at a time: each reads its own history
                for item in items:
                    await apply_item(
                        self._db, plan_id, item["task_id"], item["tenant"], plan.arguments,
                        plan.operator,
                    )  # fmt: skip
            else:
                by_tenant: dict[str, list[Mapping[str, Any]]] = {}
                for item in items:
                    by_tenant.setdefault(item["tenant"], []).append(item)
                for tenant, group in sorted(by_tenant.items()):
                    await self._apply_batch(plan, tenant, group)
            if progress is not None:
                progress(len(items))
        await self._db.execute("finish_bulk_plan", {"plan_id": plan_id})
        return await self.get(plan_id)


    async def _apply_batch(
        self, plan: Plan, tenant: str, items: Sequence[Mapping[str, Any]]
    ) -> None:
        """Act on a batch's items of one tenant, then cancel the cancelled tasks' children.

        One statement, on the tenant's shard when the store is distributed by tenant.
        """
        params = {
            "plan_id": plan.id,
            "task_ids": [item["task_id"] for item in items],
            "operator": plan.operator,
            "tenant": tenant,
            **_action_params(plan, items),
        }
        rows = await self._db.fetch_all_then(
            f"bulk_{plan.action}", params, functools.partial(_wakes, plan, tenant)
        )
        if plan.action == "cancel":
            applied = [r["task_id"] for r in rows if r["outcome"] == "applied"]
            if applied:
                await self._tasks.cancel_descendants(applied, tenant)


def _wakes(
    plan: Plan, tenant: str, rows: Sequence[Mapping[str, Any]]
) -> tuple[str, dict[str, Any]] | None:
    """What a batch of the plan (tasks of ``tenant``) wakes in the same transaction.

    The waiting branches its signals are for, or the branches waiting for the children it
    cancelled.
    """
    applied = [row["task_id"] for row in rows if row["outcome"] == "applied"]
    if plan.action == "signal":
        key = f"signal:{plan.arguments['name']}"
        return wake_branches_of([(task_id, key, None) for task_id in applied], tenant)
    if plan.action == "cancel":
        return ended_children(applied, tenant)
    return None


def _action_params(plan: Plan, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The action's parameters for one batch of open items."""
    arguments = plan.arguments
    if plan.action == "cancel":
        return {"reason": arguments["reason"]}
    if plan.action == "signal":
        payloads = arguments.get("payloads", {})
        rows = [
            {"task_id": item["task_id"],
             "payload": payloads.get(item["digest"], arguments["payload"])}
            for item in items
        ]  # fmt: skip
        return {"name": arguments["name"], "rows": Jsonb(rows), "address": None, "event_id": None}
    outcome = arguments["outcome"]
    rows = [
        {
            "task_id": item["task_id"],
            "occurrence": item["pending"],
            "resolution": {
                "occurrence": item["pending"],
                "outcome": outcome,
                "result": arguments["result"],
                "error": arguments["error"],
            },
        }
        for item in items
        if item["pending"] is not None
    ]
    record = {"completed": "completed", "failed": "failed", "retry": None}[outcome]
    return {
        "rows": Jsonb(rows),
        "record": record,
        "result": Jsonb(arguments["result"]) if outcome == "completed" else None,
        "error": Jsonb(arguments["error"]) if outcome == "failed" else None,
    }
