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
import re
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.checkpoint import Checkpoint
from toolkit.definition import WorkflowDefinition
from toolkit.definition.cadence import Cadence, CronCadence, IntervalCadence, parse_cadence
from toolkit.definition.expressions import compile_template
from toolkit.errors import (
    ExpressionError,
    ExpressionSyntaxError,
    InputError,
    PayloadRefused,
    ToolkitError,
)
from toolkit.payload import check_payload
from toolkit.store.database import Database
from toolkit.store.definitions import DefinitionCatalog
from toolkit.store.names import check_tenant
from toolkit.store.tags import check_tags, merged_tags
from toolkit.store.tick_plan import CATCHUPS, OVERLAPS, Catchup, Overlap, TickPlan, plan_ticks

#: A schedule's name: what ``toolkit schedules`` commands take.
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}")
#: Most ticks one backfill may start.
MAX_BACKFILL = 10_000
_CADENCE = frozenset({"cron", "every", "offset", "timezone"})
#: The fields :meth:`Schedules.update` changes.
_CHANGEABLE = _CADENCE | {
    "input", "tenant", "tags", "overlap", "catchup", "catchup_window", "pause_after_failures",
}


class UnknownSchedule(ToolkitError):
    """There is no schedule of that name."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule as stored, with how many of its runs are live.

    Attributes:
        name: its name.
        definition_name: the definition its ticks start (its newest active version).
        owner: ``store`` (made at run time) or ``definition`` (declared in the YAML of
            version ``owner_version``).
        owner_version: see ``owner``.
        cadence: when it ticks.
        input: the task input, a template (``${ context.scheduled_at }``,
            ``${ context.schedule }``).
        tenant: the tenant of its tasks.
        tags: tags of its tasks.
        overlap: the overlap policy.
        catchup: the catch-up policy; ``catchup_window`` its window (``all``), seconds.
        catchup_window: see ``catchup``.
        pause_after_failures: pause it after this many consecutive failed runs (None: never).
        paused: whether it is paused; ``pause_note`` why.
        pause_note: see ``paused``.
        consecutive_failures: failed runs since the last success.
        next_tick: its first tick not handled yet (database time).
        buffered: ticks waiting for the live run to end.
        fired, skipped, missed, caught_up: counts of ticks, since it was made.
        last_tick: the newest tick that started a run.
        live: its live runs.
    """

    name: str
    definition_name: str
    owner: str
    owner_version: int | None
    cadence: Cadence
    input: Any
    tenant: str
    tags: dict[str, str]
    overlap: Overlap
    catchup: Catchup
    catchup_window: float | None
    pause_after_failures: int | None
    paused: bool
    pause_note: str | None
    consecutive_failures: int
    next_tick: datetime.datetime
    buffered: tuple[datetime.datetime, ...]
    fired: int
    skipped: int
    missed: int
    caught_up: int
    last_tick: datetime.datetime | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    live: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Schedule:
        """A schedule from its row (``schedule_columns``)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in row.items() if k in fields}
        values["cadence"] = cadence_from_json(row["cadence"])
        values["buffered"] = tuple(datetime.datetime.fromisoformat(t) for t in row["buffered"])
        return cls(**values)

    def describe(self) -> str:
        """The schedule in a line: cadence, definition, policies."""
        catchup = self.catchup if self.catchup != "all" else f"all within {self.catchup_window:g} s"
        return (
            f"{self.cadence.describe()} starts {self.definition_name} (tenant {self.tenant}); "
            f"overlap {self.overlap}, catch-up {catchup}"
        )


def cadence_json(cadence: Cadence) -> dict[str, Any]:
    """A cadence as stored: ``{"cron", "timezone"}`` or ``{"every", "offset"}`` (seconds)."""
    if isinstance(cadence, CronCadence):
        return {"cron": cadence.expression, "timezone": cadence.timezone}
    return {"every": cadence.every_seconds, "offset": cadence.offset_seconds}


def cadence_from_json(data: Mapping[str, Any]) -> Cadence:
    """The cadence a schedule row stores (see :func:`cadence_json`)."""
    if "cron" in data:
        return CronCadence(data["cron"], data.get("timezone", "UTC"))
    return IntervalCadence(float(data["every"]), float(data.get("offset", 0.0)))


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
        if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
            raise InputError(
                f"schedule name {name!r} is not one: 1 to 200 letters, digits, '_', '.', ':', "
                "'/' or '-', not starting with a punctuation mark",
                path="$.name",
            )
        cadence = parse_cadence(cron=cron, every=every, offset=offset, timezone=timezone)
        window = _settings(overlap, catchup, catchup_window, pause_after_failures)
        target = await self._definitions.submittable(definition)
        tags = check_tags(tags or {}, path="$.tags")
        now = await self._now()
        _render(target, name, input, cadence.next_after(now), tags, self._db)
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
        if old.owner != "store":
            raise InputError(
                f"schedule {name!r} is declared by {old.definition_name} "
                f"v{old.owner_version}: change it in that YAML and deploy a new version",
                path="$.name",
            )
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
        window = _settings(merged["overlap"], merged["catchup"], merged["catchup_window"],
                           merged["pause_after_failures"])  # fmt: skip
        target = await self._definitions.submittable(old.definition_name)
        tags = check_tags(merged["tags"] or {}, path="$.tags")
        now = await self._now()
        next_tick = cadence.next_after(now) if cadence != old.cadence else old.next_tick
        _render(target, name, merged["input"], next_tick, tags, self._db)
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
        """Delete a schedule; its live runs go on.

        Raises:
            UnknownSchedule: there is none of that name.
        """
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
            value, tags = _render(
                definition, schedule.name, schedule.input, tick, schedule.tags, self._db
            )
            key = keys[index] if keys else tick_key(schedule.name, tick)
            runs.append({"tick": tick.isoformat(), "input": value, "tags": tags, "key": key})
        params = {
            "name": schedule.name,
            "definition_name": definition.name,
            "version": definition.version,
            "digest": definition.digest,
            "checkpoint": Jsonb(Checkpoint.initial(definition.start, definition.budget).to_json()),
            "timeout": definition.timeout,
            "runs": Jsonb(runs),
            "expected_next": schedule.next_tick if plan else None,
            "expected_buffered": Jsonb([t.isoformat() for t in schedule.buffered]),
            "next_tick": plan.next_tick if plan else None,
            "buffered": Jsonb([t.isoformat() for t in plan.buffered]) if plan else None,
            "skipped": plan.skipped if plan else 0,
            "missed": plan.missed if plan else 0,
            "caught_up": plan.caught_up if plan else 0,
        }
        row = await self._db.fetch_one("fire_schedule", params)
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


def tick_key(name: str, tick: datetime.datetime) -> str:
    """The idempotency key of a schedule's tick: one task per (schedule, tick time)."""
    return f"schedule/{name}/{tick.astimezone(datetime.UTC).isoformat()}"


def _settings(
    overlap: str, catchup: str, window: str | float | None, pause_after: int | None
) -> float | None:
    """Check the policies; return the catch-up window in seconds.

    Raises:
        InputError: an unknown policy, a window without ``all`` (or ``all`` without one),
            or a pause-after count below 1.
    """
    from toolkit.durations import parse_duration

    if overlap not in OVERLAPS:
        raise InputError(f"overlap {overlap!r}: one of {', '.join(OVERLAPS)}", path="$.overlap")
    if catchup not in CATCHUPS:
        raise InputError(f"catchup {catchup!r}: one of {', '.join(CATCHUPS)}", path="$.catchup")
    if (catchup == "all") != (window is not None):
        raise InputError(
            "catchup 'all' takes a window (all within 6h), and only it does", path="$.catchup"
        )
    if pause_after is not None and (isinstance(pause_after, bool) or pause_after < 1):
        raise InputError(
            f"pause_after_failures must be 1 or more, not {pause_after!r}",
            path="$.pause_after_failures",
        )
    if window is None:
        return None
    try:
        seconds = parse_duration(window)
    except ValueError as exc:
        raise InputError(f"catchup window: {exc}", path="$.catchup") from None
    if seconds <= 0:
        raise InputError("the catch-up window must be longer than 0", path="$.catchup")
    return seconds


def _render(
    definition: WorkflowDefinition,
    name: str,
    template: Any,
    tick: datetime.datetime,
    tags: Mapping[str, str],
    db: Database,
) -> tuple[Any, dict[str, str]]:
    """A tick's task input (the template rendered, checked) and tags.

    Raises:
        InputError: the input does not render, is over the payload limits or fails the
            definition's input schema; ``path`` starts ``$.input``.
    """
    context = {"scheduled_at": tick.astimezone(datetime.UTC).isoformat(), "schedule": name}
    try:
        value = compile_template(template if template is not None else {}, path="$.input")
        rendered = value.render({"input": {}, "steps": {}, "context": context})
        check_payload(rendered, db.payload_limits)
        checked = definition.validate_input(rendered)
    except (ExpressionError, ExpressionSyntaxError, PayloadRefused) as exc:
        raise InputError(f"schedule {name!r}: input: {exc}", path="$.input") from exc
    except InputError as exc:
        raise InputError(
            f"schedule {name!r}: its input fails the input schema: {exc.message}",
            path=f"$.input{(exc.path or '$')[1:]}",
        ) from exc
    return checked, merged_tags(definition.task_tags(checked), tags)
