"""Tasks: submit them and act on one (signal, complete, cancel, reconcile).

Reading tasks (one, a filtered page, counts, a result) is the other half of
:class:`Tasks`, in :mod:`toolkit.store.task_reads`.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from psycopg.types.json import Jsonb

from toolkit.definition import (
    WorkflowDefinition,
    definition_from_body,
    error_name_problem,
    validate_payload,
)
from toolkit.errors import (
    ConcurrencyKeyBusy,
    InputError,
    NotReconcilable,
    PayloadRefused,
    SignalAmbiguous,
    SubmitConflict,
    TaskTerminal,
    UnknownSignal,
)
from toolkit.lifecycle import TaskState
from toolkit.payload import check_payload
from toolkit.store.branches import BranchRows
from toolkit.store.callbacks import Callbacks, wake_branches_of
from toolkit.store.concurrency_keys import apply_policy, refused_or_cancelled
from toolkit.store.database import Database
from toolkit.store.descendants import cancel_descendants, ended_children
from toolkit.store.key_locks import insert_keyed
from toolkit.store.names import check_signal_name, check_tenant
from toolkit.store.redrive import RedriveOptions, RedrivePlan, redrive
from toolkit.store.signal_waits import (
    addresses_match,
    branch_signal_schema,
    signal_addresses,
    signal_waits,
)
from toolkit.store.submission import (
    checked_input,
    keyed_params,
    queue_tasks,
    register_tenant,
)
from toolkit.store.submit_flow import no_delayed_start, submit_flowing
from toolkit.store.task_reads import TERMINAL_STATES as TERMINAL_STATES
from toolkit.store.task_reads import TaskReads
from toolkit.store.task_reads import TaskRecord as TaskRecord
from toolkit.store.task_tenants import task_tenant, unknown_task


#: An error name a callback completion may report: what ``catch`` and ``retry`` match.
def check_error_name(error: str) -> None:
    """Refuse an error name given from outside (a callback's, an operator's).

    Raises:
        InputError: it is not an error name a definition could write (``fail.error``).
    """
    problem = error_name_problem(error)
    if problem is not None:
        raise InputError(f"{error!r} is not a valid error name: {problem}", path="$.error")


class Tasks(TaskReads):
    """Submit tasks, act on one, and read them (:class:`TaskReads`)."""

    def _checked(self, value: Any, what: str) -> Any:
        """A signal payload or reconciled result checked against the payload limits."""
        try:
            check_payload(value, self._db.payload_limits)
        except PayloadRefused as exc:
            raise InputError(f"invalid {what}: {exc}", path=exc.path) from exc
        return value

    async def submit(
        self,
        definition: WorkflowDefinition,
        inputs: Sequence[Any],
        *,
        tenant: str = "default",
        budget: Mapping[str, float] | None = None,
        timeout: float | None = None,
        tags: Mapping[str, str] | None = None,
        start_at: datetime.datetime | None = None,
        delay: float | None = None,
        priority: int | None = None,
    ) -> list[int]:
        """Queue one task per input, validated against the definition's input schema.

        All inputs are validated before anything is written; idle workers are woken by a
        NOTIFY carrying no data. Each input must be storable JSON within the database's
        payload limits (``db.payload_limits``: 1 MiB of JSON text and 64 levels of nesting
        by default; no NUL characters, no NaN).

        Args:
            definition: a deployed definition; the tasks are pinned to its digest.
            inputs: task inputs (JSON values).
            tenant: the tenant the tasks belong to.
            budget: overrides of the definition's ``budget``, by resource (amounts ≥ 0);
                each must fit in the tenant's budget for the resource, when it has one.
            timeout: overrides the definition's workflow ``timeout``: seconds from now (> 0)
                until the deadline.
            tags: tags of every task (key to string value, :mod:`toolkit.store.tags`), over
                those the definition's ``tags`` give from each input.
            start_at: a delayed start: the tasks are queued, and claimed from this time on
                (an aware datetime; until then they can be cancelled and never run).
            delay: a delayed start in seconds from now (database time), instead.
            priority: overrides the definition's ``priority`` (0, lowest, to 9): inside
                the tenant's share a due task of priority p is claimed as if it had been
                due p minutes earlier (docs/flow-control.md#priority).

        Returns:
            The new task ids, in input order.

        Raises:
            InputError: ``inputs`` is a dict or a string, not a list; an input is over the
                payload limits, is not storable JSON, or fails the input schema; ``path``
                locates the fault (nothing written). Also for a budget override over the
                tenant's budget, for tags that break the tag rules or limits, and for a
                concurrency key the input does not give.
            ConcurrencyKeyBusy: the definition's ``concurrency`` says ``on_conflict: skip``
                and a key has ``max_active`` live tasks (nothing written;
                docs/flow-control.md). The other policies: ``queue`` parks the task until
                the key has room; ``cancel_newest`` and ``cancel_running`` cancel tasks.
            Throttled: the definition's ``throttle`` says ``excess: refuse`` and a key is
                past its rate; the inputs before it were submitted (their ids are lost to
                the caller: submit one input per call to know them).

        A definition with ``debounce`` returns, per input, the task it went to: inputs of
        one key within the quiet period give the same id (docs/flow-control.md). With
        ``throttle`` each task waits for the start its key allows. Neither takes
        ``start_at`` or ``delay``.
        """
        check_tenant(tenant)
        validated = _checked_inputs(self._db, definition, inputs)
        if not validated:
            return []
        if definition.debounce is not None or definition.throttle is not None:
            no_delayed_start(definition, start_at, delay)
            queue = functools.partial(
                queue_tasks, self._db, definition, tenant=tenant, budget=budget,
                timeout=timeout, tags=tags, cancel=self.cancel, priority=priority,
            )  # fmt: skip
            return await submit_flowing(
                self._db, definition, validated, tenant=tenant, budget=budget, timeout=timeout,
                tags=tags, queue=queue, priority=priority,
            )  # fmt: skip
        return await queue_tasks(
            self._db, definition, validated, tenant=tenant, budget=budget, timeout=timeout,
            tags=tags, cancel=self.cancel, start_at=start_at, delay=delay, priority=priority,
        )  # fmt: skip

    async def submit_keyed(
        self,
        definition: WorkflowDefinition,
        value: Any,
        *,
        key: str,
        tenant: str = "default",
        budget: Mapping[str, float] | None = None,
        timeout: float | None = None,
        tags: Mapping[str, str] | None = None,
        start_at: datetime.datetime | None = None,
        delay: float | None = None,
        priority: int | None = None,
    ) -> tuple[int, bool]:
        """Queue one task unless the tenant already has a task with idempotency key ``key``.

        Args:
            definition: a deployed definition.
            value: the task input, validated against the input schema.
            key: the idempotency key, unique per tenant.
            tenant: the tenant.
            budget: overrides of the definition's budget (see `submit`).
            timeout: overrides the definition's workflow timeout (see `submit`).
            tags: the task's tags (see `submit`).
            start_at: a delayed start (see `submit`).
            delay: a delayed start in seconds (see `submit`).
            priority: overrides the definition's priority (see `submit`).

        Returns:
            ``(task id, created)``: the new task, or the existing one at once (no retry loop).

        Raises:
            InputError: the input is over the payload limits, is not storable JSON, or fails
                the input schema (nothing written).
            SubmitConflict: the existing task runs another definition version or digest.
            ConcurrencyKeyBusy: as in `submit` (unless the task of ``key`` exists).
        """
        params = await keyed_params(
            self._db, definition, value, key=key, tenant=tenant, budget=budget, timeout=timeout,
            tags=tags, start_at=start_at, delay=delay, priority=priority,
        )  # fmt: skip
        keys = [params["concurrency_key"]]
        try:
            cancel_newest = await refused_or_cancelled(self._db, definition, tenant, keys)
        except ConcurrencyKeyBusy:
            if not await self._db.fetch_one("task_by_idempotency_key", params):
                raise
            cancel_newest = set()  # the task of this key exists: the submit returns it
        held = [(tenant, definition.name, k) for k in keys if k is not None]
        await register_tenant(self._db, params["tenant"])
        rows = await insert_keyed(self._db, "submit_keyed_task", params, held)
        if not rows:  # inserted by a concurrent submit after this statement's snapshot
            rows = await insert_keyed(self._db, "submit_keyed_task", params, held)
        assert rows, "a keyed submit returns the new or the existing task"
        row = rows[0]
        if row["created"]:
            await apply_policy(self._db, definition, tenant, keys, [row["id"]], cancel_newest,
                               self.cancel)  # fmt: skip
        if row["definition_digest"] != definition.digest:
            raise SubmitConflict(
                f"tenant {tenant!r} already has task {row['id']} with key {key!r}, for "
                f"{row['definition_name']} version {row['definition_version']}",
                task_id=row["id"],
                definition=(row["definition_name"], row["definition_version"]),
            )
        return int(row["id"]), bool(row["created"])

    async def signal(
        self,
        task_id: int,
        name: str,
        payload: Any = None,
        *,
        force: bool = False,
        address: str | None = None,
        tenant: str | None = None,
    ) -> int:
        """Send signal ``name`` to a task; it is kept until a ``wait: {signal: name}`` consumes it.

        Each signal is consumed exactly once, in the order sent. A task already waiting for
        ``name`` is woken at once (NOTIFY). Inside a parallel or map step (docs/composition.md,
        addressing): a signal addressed to a branch is taken only by a wait of that branch;
        one to the task as a whole goes to the one branch waiting for it, and is kept
        task-wide when none waits yet (the first wait for the name takes it).

        Args:
            task_id: the task.
            name: the signal's name; some wait step of the task's definition must name it,
                unless ``force`` (docs/decisions.md, "A signal no step waits for").
            payload: any JSON value.
            force: store the signal even if no step waits for ``name``.
            address: the branch (a parallel branch's name, a map item's index as text) it
                is for; None: the task as a whole.
            tenant: the task's tenant, if known; else looked up by the id
                (:func:`~toolkit.store.task_tenants.task_tenant`).

        Returns:
            The signal's id.

        Raises:
            UnknownTask: no such task.
            TaskTerminal: the task has ended; the signal was not stored.
            InputError: the payload is over the payload limits or not storable JSON, or
                fails the schema its wait step declares (``wait: {signal, schema}``) — the
                message names the path of the fault; the signal was not stored. Defaults
                of that schema are applied to the stored payload; or ``name`` is not a
                signal name any wait step could wait for.
            UnknownSignal: no step of the task's definition waits for ``name`` (and not
                ``force``); the message lists the names its steps wait for.
            SignalAmbiguous: no ``address``, and several branches wait for ``name``; the
                message lists them.
        """
        check_signal_name(name)
        payload = self._checked(payload, f"payload of signal {name!r}")
        given, tenant = tenant, await task_tenant(self._db, task_id, tenant)
        if tenant is None:
            raise unknown_task(task_id, given)
        found = await _signal_wait(self._db, task_id, tenant)
        waited, schema = signal_waits(*found, name) if found else (None, None)
        if waited is not None and name not in waited and not force:
            raise UnknownSignal(task_id=task_id, name=name, waited=waited)
        if found and address is not None and not force:
            shapes = signal_addresses(found[0].steps, name)
            if not any(addresses_match(shape, address) for shape in shapes):
                raise UnknownSignal(
                    task_id=task_id, name=name, waited=waited or (), address=address,
                    addresses=shapes,
                )  # fmt: skip
        waiters = await BranchRows(self._db).signal_waiters(task_id, name, tenant=tenant)
        if address is None:
            if len(waiters) > 1:
                raise SignalAmbiguous(task_id, name, [w.address for w in waiters])
            address = waiters[0].address if waiters else None
        waiter = next((w for w in waiters if w.address == address), None)
        if found and waiter is not None:  # the wait step of the branch it goes to decides
            schema = branch_signal_schema(found[0], waiter, name, schema)
        if schema is not None:
            payload = validate_payload(schema, payload, f"payload of signal {name!r}")
        rows = await self._db.fetch_all_then(
            "send_signal",
            {"task_id": task_id, "tenant": tenant, "name": name, "payload": Jsonb(payload),
             "plan_id": None, "operator": None, "address": address, "event_id": None},
            lambda sent: wake_branches_of(
                [(task_id, f"signal:{name}", address) for r in sent if r["signal_id"]], tenant
            ),
        )  # fmt: skip
        row = rows[0] if rows else None
        if row is None or row["state"] is None:
            raise unknown_task(task_id, given)
        if row["signal_id"] is None:
            raise TaskTerminal(
                f"task {task_id} {TaskState(row['state']).phrase()}; signal {name!r} was not stored"
            )
        return int(row["signal_id"])

    async def complete(
        self,
        token: str,
        *,
        result: Any = None,
        error: str | None = None,
        message: str | None = None,
    ) -> int:
        """Complete the callback ``token`` of a step with ``callback`` (`toolkit complete`).

        Args:
            token: the token the step's handler handed out (``ctx.callback_token``).
            result: the step's result (JSON) when it succeeded.
            error: an error name when it failed: it goes through the step's retry and catch
                like a handler's error.
            message: the error's message.

        Returns:
            The task id.

        Raises:
            CallbackRefused: no such token, it was completed or expired already, or its
                task has ended.
            InputError: ``result`` is over the payload limits or not storable JSON, or
                ``error`` is not an error name (1 to 200 characters, no control character,
                not ``*``: as a ``fail`` step names errors).
        """
        if error is not None:
            check_error_name(error)
            detail = {"name": error, "message": message or f"{error} reported by the callback"}
            return await Callbacks(self._db).complete(token, error=detail)
        result = self._checked(result, f"result of callback {token!r}")
        return await Callbacks(self._db).complete(token, result=result)

    async def cancel(
        self, task_id: int, reason: str = "cancelled by request", *, tenant: str | None = None
    ) -> str:
        """Cancel a task, and its live child tasks (and theirs).

        A queued or waiting task (or one whose lease expired) is cancelled at once; a leased
        one gets a cancel request that its worker learns of at its next heartbeat, which
        cancels the running handler. Completed steps and their external writes stay done.
        ``tenant``: the task's, if known (as :meth:`signal`).

        Returns:
            ``"cancelled"`` or ``"requested"``.

        Raises:
            UnknownTask: no such task.
            TaskTerminal: the task has already ended.
        """
        known = await task_tenant(self._db, task_id, tenant)
        row = await self._request_cancel(task_id, reason, known) if known is not None else None
        if row is None or row["previous_state"] is None:
            raise unknown_task(task_id, tenant)
        if row["cancelled"] or row["requested"]:
            await self.cancel_descendants([task_id], known)
        if row["cancelled"]:
            return "cancelled"
        if row["requested"]:
            return "requested"
        ended = TaskState(row["previous_state"]).phrase()
        raise TaskTerminal(f"task {task_id} {ended}; it cannot be cancelled")

    async def cancel_descendants(self, task_ids: Sequence[int], tenant: str | None = None) -> int:
        """Cancel the live children of cancelled tasks (and theirs); how many.

        As :meth:`cancel` does each (:func:`toolkit.store.descendants.cancel_descendants`;
        ``tenant``: theirs when they have one).
        """
        return await cancel_descendants(self._db, task_ids, tenant)

    async def _request_cancel(
        self, task_id: int, reason: str, tenant: str
    ) -> dict[str, Any] | None:
        """``request_cancel``; a child cancelled at once wakes its parent's waiting branch."""
        rows = await self._db.fetch_all_then(
            "request_cancel",
            cancel_params(task_id, tenant, reason),
            lambda done: ended_children(
                [task_id] if done and done[0]["cancelled"] else [], tenant
            ),
        )
        return rows[0] if rows else None

    async def reconcile(
        self,
        task_id: int,
        step: str,
        outcome: Literal["completed", "failed", "retry"],
        *,
        result: Any = None,
        error: str | None = None,
        message: str | None = None,
        operator: str = "operator",
        tenant: str | None = None,
    ) -> None:
        """Resolve an effect whose intent was recorded without an outcome (DESIGN §2).

        ``completed`` records ``result`` as the effect's evidence and the workflow continues
        as if the handler had returned it; ``failed`` records ``error`` and goes through the
        step's retry and catch policy (``error`` is the error name retry and catch rules match,
        default ``ReconciledFailure``); ``retry`` calls the handler again with the same
        idempotency key (the operator takes the risk of a second call). ``tenant``: the
        task's, if known (as :meth:`signal`).

        Raises:
            UnknownTask: no such task.
            NotReconcilable: the task is not waiting for reconciliation of ``step``.
            InputError: ``result`` is over the payload limits or not storable JSON.
        """
        if outcome == "completed":
            self._checked(result, f"result of step {step!r}")
        task = await self.get(task_id, tenant=tenant)
        pending = task.checkpoint.get("pending")
        # ``step`` names the step of the pending occurrence: at the task's level (``charge``
        # for ``charge#1``) or in a branch (``charge`` or ``fan`` for ``fan#1/a/charge#1``).
        names = {str(pending).split("#", 1)[0], str(pending).rsplit("/", 1)[-1].split("#")[0]}
        if task.wait_reason != "reconciliation" or step not in names:
            waiting_on = f" (it waits on {pending})" if task.wait_reason == "reconciliation" else ""
            raise NotReconcilable(
                f"task {task_id} {TaskState(task.state).phrase(task.wait_reason)}, not waiting "
                f"for reconciliation of step {step!r}{waiting_on}"
            )
        error_data = {
            "name": error or "ReconciledFailure",
            "message": message or "failure recorded by reconciliation",
        }
        record = {"completed": "completed", "failed": "failed", "retry": None}[outcome]
        resolution = {
            "occurrence": pending,
            "outcome": outcome,
            "result": result if outcome == "completed" else None,
            "error": error_data if outcome == "failed" else None,
        }
        row = await self._db.fetch_one(
            "reconcile_effect",
            {
                "task_id": task_id,
                "tenant": task.tenant,
                "occurrence": pending,
                "record": record,
                "operator": operator,
                "plan_id": None,
                "result": Jsonb(result) if outcome == "completed" else None,
                "error": Jsonb(error_data) if outcome == "failed" else None,
                "resolution": Jsonb(resolution),
            },
        )
        if row is None:
            raise NotReconcilable(f"task {task_id} changed while reconciling; look again")

    async def redrive(
        self,
        task_id: int,
        *,
        from_step: str | None = None,
        version: int | None = None,
        rerun: Sequence[str] = (),
        timeout: float | None = None,
        reason: str | None = None,
        operator: str = "operator",
        dry_run: bool = False,
        token: int | None = None,
        tenant: str | None = None,
    ) -> RedrivePlan:
        """Bring a ``failed`` or ``cancelled`` task back (issue 19; docs/reliability.md).

        By default it resumes at the step that failed (or where it was cancelled), with a
        fresh attempt budget, keeping every completed step's recorded result; a parallel or
        map step runs again only its branches that did not succeed; a failed child is
        redriven with it. ``from_step`` resumes at an earlier step: the steps reachable from
        it that the task ran are re-planned and run again, as new occurrences (new
        idempotency keys); a completed effect that is not idempotent is refused unless its
        step is in ``rerun``. An effect of unknown outcome is reconciled first.

        Args:
            task_id: the task.
            from_step: resume at this step (one the task ran).
            version: resume on this version of the task's definition (retired ones too);
                what the task completed, and the resume step, must map onto it.
            rerun: non-idempotent steps that may be called again.
            timeout: a new workflow deadline, seconds from now: required for a task failed
                by its deadline (or whose deadline has passed), refused otherwise.
            reason: why, recorded in the ``redriven`` event.
            operator: who, recorded likewise.
            dry_run: only plan; nothing is written.
            token: apply only while the task's fencing token is still this one (the
                ``plan.token`` of the dry run the operator read); None: any.
            tenant: the task's tenant, if known (as :meth:`signal`).

        Returns:
            The plan; ``plan.lines()`` is the preview.

        Raises:
            UnknownTask: no such task.
            UnknownDefinition: ``version`` is not deployed.
            NotRedrivable: not in a state to redrive, not as asked, or its token is not
                ``token`` (the message says why).
            RedriveRefused: effects would run again that may not; ``exc.plan`` says which.
        """
        options = RedriveOptions(from_step, frozenset(rerun), timeout, version)
        return await redrive(
            self._db, task_id, options, reason=reason, operator=operator, dry_run=dry_run,
            token=token, tenant=tenant,
        )  # fmt: skip


async def _signal_wait(
    db: Database, task_id: int, tenant: str | None
) -> tuple[WorkflowDefinition, str | None] | None:
    """The task's definition and the step its own graph is at (its cursor).

    None for an ended or unknown task (the signal is refused for that).
    """
    row = await db.fetch_one("task_definition_body", {"task_id": task_id, "tenant": tenant})
    if row is None or row["body"] is None or row["state"] in TERMINAL_STATES:
        return None
    return definition_from_body(row["body"]), (row["checkpoint"] or {}).get("cursor")


def cancel_params(task_id: int, tenant: str | None, reason: str) -> dict[str, Any]:
    """The parameters of ``request_cancel`` for one task, outside any bulk plan."""
    return {
        "task_id": task_id,
        "tenant": tenant,
        "reason": reason,
        "plan_id": None,
        "operator": None,
    }


def _checked_inputs(
    db: Database, definition: WorkflowDefinition, inputs: Sequence[Any]
) -> list[Any]:
    """Each input checked (``checked_input``), once ``inputs`` is known to be a list of them.

    A dict or a string iterates too: submitted as such, it made one task per key or per
    character.

    Raises:
        InputError: ``inputs`` is a mapping, a string or bytes; or an input is refused.
    """
    if isinstance(inputs, (str, bytes, bytearray, Mapping)):
        raise InputError(
            f"inputs must be a list of task inputs, one task each; got a "
            f"{type(inputs).__name__}: pass [value] to submit one task"
        )
    return [checked_input(db, definition, value) for value in inputs]
