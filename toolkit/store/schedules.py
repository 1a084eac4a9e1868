"""Recurring schedules: each tick of a cadence starts one task, once across the fleet.

A schedule (DESIGN §7, docs/schedules.md) belongs to a definition name, and each tick starts
a task of that definition's newest active version, keyed by (schedule, tick time): the
task's idempotency key is ``schedule/NAME/TICK``. Workers fire due ticks in their firing pass
(:meth:`Schedules.fire_due`, in database time): the pass reads the due schedules, plans each
(:func:`~toolkit.store.tick_plan.plan_ticks`: catch-up, overlap) and fires the plan by a
compare-and-set on the schedule's next tick in one statement, so two workers never both fire
a tick, and the idempotency key makes even that impossible twice.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.checkpoint import Checkpoint
from toolkit.definition.cadence import parse_cadence
from toolkit.definition.schedules import Catchup, Overlap
from toolkit.errors import InputError, ToolkitError
from toolkit.store.database import Database
from toolkit.store.definitions import DefinitionCatalog
from toolkit.store.key_locks import insert_keyed
from toolkit.store.names import check_tenant
from toolkit.store.schedule_values import (
    Schedule,
    UnknownSchedule,
    cadence_json,
    check_name,
    check_settings,
    render_tick,
    tick_key,
)
from toolkit.store.submission import concurrency_params, register_tenant
from toolkit.store.tags import check_tags
from toolkit.store.tick_plan import TickPlan, plan_ticks
from toolkit.tracing import current_traceparent

__all__ = ["MAX_BACKFILL", "Fired", "Schedule", "Schedules", "UnknownSchedule", "tick_key"]

#: Most ticks one backfill may start.
MAX_BACKFILL = 10_000

_CADENCE = frozenset({"cron", "every", "offset", "timezone"})
#: The fields :meth:`Schedules.update` changes.
_CHANGEABLE = _CADENCE | {
    "input", "tenant", "tags", "overlap", "catchup", "catchup_window", "pause_after_failures",
}


@dataclasses.dataclass(frozen=True)
class Fired:
    """What a firing pass did with one schedule.

    Attributes:
        schedule: the schedule's name.
        plan: the plan it fired.
        task_ids: the tasks started.
        lag: seconds from each started tick to now (database time).
    """

    schedule: str
    plan: TickPlan
    task_ids: tuple[int, ...]
    lag: tuple[float, ...]


class Schedules:
    """Make, change, pause and fire schedules."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._definitions = DefinitionCatalog(db)

    async def _now(self) -> datetime.datetime:
        row = await self._db.fetch_one("database_now")
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]

    async def create(
        self,
        name: str,
        definition: str,
        *,
        cron: str | None = None,
        every: str | float | None = None,
        offset: str | float | None = None,
        timezone: str = "UTC",
        input: Any = None,
        tenant: str = "default",
        tags: Mapping[str, str] | None = None,
        overlap: Overlap = "skip",
        catchup: Catchup = "latest",
        catchup_window: str | float | None = None,
        pause_after_failures: int | None = None,
    ) -> Schedule:
        """Make a schedule of the store (deploys never touch it).

        Args:
            name: its name (letters, digits, ``_ . : / -``; at most 200 characters).
            definition: the definition name its ticks start (it must be deployed).
            cron: a five-field cron expression or an alias (``@daily``), read in ``timezone``.
            every: instead of ``cron``, an interval (``15m``, or seconds); ``offset`` within it.
            offset: see ``every``.
            timezone: an IANA time zone for ``cron``.
            input: the task input, a JSON template that may read ``context.scheduled_at``
                (the tick, ISO 8601) and ``context.schedule`` (the name).
            tenant: the tenant of its tasks.
            tags: tags of its tasks (with the definition's own).
            overlap: ``skip``, ``buffer_one``, ``buffer_all``, ``cancel_other`` or ``allow_all``.
            catchup: ``none``, ``latest`` or ``all`` (with ``catchup_window``).
            catchup_window: with ``catchup="all"``, how old a missed tick may be and still
                fire (a duration).
            pause_after_failures: pause after this many consecutive failed runs.

        Returns:
            The schedule.

        Raises:
            InputError: a field is not valid (``path`` names it): the name, the cadence,
                the time zone, the policies, the tags, or the input, which must pass the
                definition's input schema for a sample tick.
            UnknownDefinition, DefinitionRetired: no active version of ``definition``.
        """
        check_name(name)
        cadence = parse_cadence(cron=cron, every=every, offset=offset, timezone=timezone)
        window = check_settings(overlap, catchup, catchup_window, pause_after_failures)
        target = await self._definitions.submittable(definition)
        tags = check_tags(tags or {}, path="$.tags")
        now = await self._now()
        render_tick(target, name, input, cadence.next_after(now), tags, self._db)
        row = await self._db.fetch_one(
            "create_schedule",
            {
                "name": name, "definition_name": definition, "owner": "store",
                "owner_version": None, "cadence": Jsonb(cadence_json(cadence)),
                "input": Jsonb(input if input is not None else {}),
                "tenant": check_tenant(tenant), "tags": Jsonb(tags), "overlap": overlap,
                "catchup": catchup, "catchup_window": window,
                "pause_after_failures": pause_after_failures,
                "next_tick": cadence.next_after(now),
            },
        )  # fmt: skip
        if row is None:
            raise InputError(f"a schedule named {name!r} exists already", path="$.name")
        return await self.get(name)

    async def update(self, name: str, **changes: Any) -> Schedule:
        """Change a store-owned schedule; the fields not given keep their values.

        Args:
            name: the schedule.
            changes: fields of :meth:`create` (``cron`` or ``every`` with ``offset``,
                ``timezone``, ``input``, ``tenant``, ``tags``, ``overlap``, ``catchup``,
                ``catchup_window``, ``pause_after_failures``). A new cadence starts from its
                first tick after now.

        Raises:
            UnknownSchedule: there is none of that name.
            InputError: a field is not valid, or the schedule is owned by its definition's
                YAML (change it there, and deploy).
        """
        old = await self.get(name)
        _refuse_declared(old, "change it in that YAML")
        unknown = set(changes) - _CHANGEABLE
        if unknown:
            raise TypeError(f"no schedule field {', '.join(sorted(unknown))}")
        cadence = old.cadence
        given = {k: v for k, v in changes.items() if k in _CADENCE}
        if given:
            fields: dict[str, Any] = cadence_json(cadence)
            if "cron" in given:
                fields = {"cron": given["cron"], "timezone": fields.get("timezone", "UTC")}
            elif "every" in given:
                fields = {"every": given["every"], "offset": fields.get("offset", 0.0)}
            cadence = parse_cadence(**{**fields, **given})
        merged = {
            "input": old.input, "tenant": old.tenant, "tags": old.tags, "overlap": old.overlap,
            "catchup": old.catchup, "catchup_window": old.catchup_window,
            "pause_after_failures": old.pause_after_failures,
            **{k: v for k, v in changes.items() if k in _CHANGEABLE - _CADENCE},
        }  # fmt: skip
        if "catchup" in changes and changes["catchup"] != "all" and "catchup_window" not in changes:
            merged["catchup_window"] = None
        window = check_settings(merged["overlap"], merged["catchup"], merged["catchup_window"],
                           merged["pause_after_failures"])  # fmt: skip
        target = await self._definitions.submittable(old.definition_name)
        tags = check_tags(merged["tags"] or {}, path="$.tags")
        now = await self._now()
        next_tick = cadence.next_after(now) if cadence != old.cadence else old.next_tick
        render_tick(target, name, merged["input"], next_tick, tags, self._db)
        await self._changed(
            "update_schedule",
            name,
            {
                "cadence": Jsonb(cadence_json(cadence)), "input": Jsonb(merged["input"]),
                "tenant": check_tenant(merged["tenant"]), "tags": Jsonb(tags),
                "overlap": merged["overlap"], "catchup": merged["catchup"],
                "catchup_window": window,
                "pause_after_failures": merged["pause_after_failures"],
                "next_tick": next_tick,
            },
        )  # fmt: skip
        return await self.get(name)

    async def get(self, name: str) -> Schedule:
        """Read one schedule.

        Raises:
            UnknownSchedule: there is none of that name.
        """
        row = await self._db.fetch_one("get_schedule", {"name": name})
        if row is None:
            raise UnknownSchedule(f"there is no schedule {name!r}")
        return Schedule.from_row(row)

    async def list(self, definition: str | None = None) -> list[Schedule]:
        """Every schedule (of ``definition``, when given), by name."""
        rows = await self._db.fetch_all("list_schedules", {"definition_name": definition})
        return [Schedule.from_row(row) for row in rows]

    async def pause(self, name: str, note: str | None = None) -> Schedule:
        """Pause a schedule: no tick fires until it is resumed.

        Raises:
            UnknownSchedule: there is none of that name.
        """
        await self._changed("pause_schedule", name, {"note": note or "paused"})
        return await self.get(name)

    async def resume(self, name: str) -> Schedule:
        """Resume a paused schedule from its next tick after now.

        The ticks that came while it was paused do not fire; its failure count starts again.

        Raises:
            UnknownSchedule: there is none of that name.
        """
        schedule = await self.get(name)
        next_tick = schedule.cadence.next_after(await self._now())
        await self._changed("resume_schedule", name, {"next_tick": next_tick})
        return await self.get(name)

    async def delete(self, name: str) -> None:
        """Delete a schedule made at run time; its live runs go on.

        Raises:
            UnknownSchedule: there is none of that name.
            InputError: it is declared in a definition's YAML (remove it there and deploy;
                pause it meanwhile).
        """
        _refuse_declared(await self.get(name), "remove it from that YAML")
        await self._changed("delete_schedule", name, {})

    async def _changed(self, statement: str, name: str, params: dict[str, Any]) -> None:
        if await self._db.fetch_one(statement, {"name": name, **params}) is None:
            raise UnknownSchedule(f"there is no schedule {name!r}")

    async def trigger(self, name: str) -> int:
        """Start one run now, whatever the overlap policy and even when paused.

        Returns:
            The task id.

        Raises:
            UnknownSchedule: there is none of that name.
            InputError: its input no longer passes the definition's input schema.
        """
        schedule = await self.get(name)
        now = await self._now()
        key = f"schedule/{name}/manual/{now.isoformat()}"
        ids = await self._start(schedule, [now], keys=[key])
        return ids[0]

    async def backfill(
        self, name: str, start: datetime.datetime, end: datetime.datetime
    ) -> builtins.list[int]:
        """Start a run for each tick in ``(start, end]`` that has none yet.

        Each tick is keyed as when it fires on time, so a tick that ran, or a backfill done
        twice, starts nothing again. The overlap policy does not apply.

        Returns:
            The task ids started, oldest tick first.

        Raises:
            UnknownSchedule: there is none of that name.
            InputError: more than :data:`MAX_BACKFILL` ticks, or an end in the future.
        """
        schedule = await self.get(name)
        if end > await self._now():
            raise InputError("a backfill ends at now at the latest", path="$.to")
        ticks = schedule.cadence.ticks(start, end, MAX_BACKFILL + 1)
        if len(ticks) > MAX_BACKFILL:
            raise InputError(
                f"the range holds more than {MAX_BACKFILL:,} ticks; backfill it in parts",
                path="$.from",
            )
        ids: builtins.list[int] = []
        for first in range(0, len(ticks), 500):
            ids += await self._start(schedule, ticks[first : first + 500])
        return ids

    async def _start(
        self,
        schedule: Schedule,
        ticks: Sequence[datetime.datetime],
        *,
        keys: Sequence[str] | None = None,
        plan: TickPlan | None = None,
    ) -> builtins.list[int]:
        """Fire ``ticks`` of a schedule: for a plan, by compare-and-set (see fire_schedule)."""
        definition = await self._definitions.submittable(schedule.definition_name)
        runs = []
        for index, tick in enumerate(ticks):
            value, tags = render_tick(
                definition, schedule.name, schedule.input, tick, schedule.tags, self._db
            )
            key = keys[index] if keys else tick_key(schedule.name, tick)
            concurrency = concurrency_params(definition, value)
            runs.append({"tick": tick.isoformat(), "input": value, "tags": tags, "key": key,
                         "concurrency_key": concurrency["concurrency_key"]})  # fmt: skip
        params = {
            "name": schedule.name,
            "tenant": schedule.tenant,
            "definition_name": definition.name,
            "version": definition.version,
            "digest": definition.digest,
            "checkpoint": Jsonb(Checkpoint.initial(definition.start, definition.budget).to_json()),
            "timeout": definition.timeout,
            "concurrency_limit": definition.concurrency and definition.concurrency.max_active,
            "priority": definition.priority,
            "trace_parent": current_traceparent(),
            "runs": Jsonb(runs),
            "expected_next": schedule.next_tick if plan else None,
            "expected_buffered": Jsonb([t.isoformat() for t in schedule.buffered]),
            "next_tick": plan.next_tick if plan else None,
            "buffered": Jsonb([t.isoformat() for t in plan.buffered]) if plan else None,
            "skipped": plan.skipped if plan else 0,
            "missed": plan.missed if plan else 0,
            "caught_up": plan.caught_up if plan else 0,
        }
        held = [(schedule.tenant, definition.name, run["concurrency_key"])
                for run in runs if run["concurrency_key"] is not None]  # fmt: skip
        await register_tenant(self._db, schedule.tenant)
        rows = await insert_keyed(self._db, "fire_schedule", params, held)
        row = rows[0] if rows else None
        if row is None or not row["applied"]:
            if plan is None:
                raise UnknownSchedule(f"there is no schedule {schedule.name!r}")
            return []
        return [int(task_id) for task_id in row["task_ids"]]

    async def fire_due(
        self, definitions: Sequence[str], limit: int = 20
    ) -> builtins.list[Fired]:
        """One firing pass over the due schedules of these definitions (a worker's).

        Each schedule is planned from what was read and fired by compare-and-set: one that
        another pass fired meanwhile is left to it. Live runs of a ``cancel_other``
        schedule are cancelled before its tick starts.

        Returns:
            What was fired, a schedule at a time (those another pass took are left out).
        """
        rows = await self._db.fetch_all("due_schedules", {"names": list(definitions),
                                                          "limit": limit})  # fmt: skip
        fired = []
        for row in rows:
            schedule, now = Schedule.from_row(row), row["now"]
            plan = plan_ticks(
                schedule.cadence, schedule.next_tick, schedule.buffered, now, schedule.live,
                overlap=schedule.overlap, catchup=schedule.catchup,
                window=schedule.catchup_window,
            )  # fmt: skip
            if plan.cancel_live:
                for task in await self._db.fetch_all("schedule_live_runs", {"name": schedule.name}):
                    await self._cancel(task["id"], f"schedule {schedule.name}: a new tick came")
            ids = await self._start(schedule, plan.start, plan=plan)
            lag = tuple((now - tick).total_seconds() for tick in plan.start)
            fired.append(Fired(schedule.name, plan, tuple(ids), lag))
        return fired

    async def _cancel(self, task_id: int, reason: str) -> None:
        from toolkit.store.tasks import Tasks

        try:
            await Tasks(self._db).cancel(task_id, reason)
        except ToolkitError:  # ended meanwhile
            pass

    async def seconds_to_next_tick(self, definitions: Sequence[str]) -> float | None:
        """Seconds until the earliest tick of these definitions' schedules (None: none)."""
        row = await self._db.fetch_one("next_schedule_tick", {"names": list(definitions)})
        return None if row is None or row["seconds"] is None else float(row["seconds"])


def _refuse_declared(schedule: Schedule, instead: str) -> None:
    """Refuse editing a schedule its definition owns: a deploy would undo the edit.

    Raises:
        InputError: it is declared in a definition's YAML.
    """
    if schedule.owner != "store":
        raise InputError(
            f"schedule {schedule.name!r} is declared by {schedule.definition_name} "
            f"v{schedule.owner_version}: {instead} and deploy a new version (pause, resume "
            "and trigger work here)",
            path="$.name",
        )
