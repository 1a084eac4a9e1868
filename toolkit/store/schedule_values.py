"""A schedule's values: its stored form, its name, its policies and a tick's task input.

Shared by the schedules made at run time (:mod:`toolkit.store.schedules`) and those a
definition declares, which deploys keep in step (:mod:`toolkit.store.schedule_deploy`).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping
from typing import Any

from toolkit.definition import WorkflowDefinition
from toolkit.definition.cadence import Cadence, CronCadence, IntervalCadence
from toolkit.definition.expressions import compile_template
from toolkit.definition.schedules import CATCHUPS, OVERLAPS, Catchup, Overlap
from toolkit.errors import (
    ExpressionError,
    ExpressionSyntaxError,
    InputError,
    PayloadRefused,
    ToolkitError,
)
from toolkit.payload import check_payload
from toolkit.store.database import Database
from toolkit.store.tags import merged_tags

#: A schedule's name: what ``toolkit schedules`` commands take.
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}")


def check_name(name: object) -> str:
    """Return ``name`` if it is a schedule name (:data:`SCHEDULE_NAME`).

    Raises:
        InputError: it is not one (path ``$.name``).
    """
    if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
        raise InputError(
            f"schedule name {name!r} is not one: 1 to 200 letters, digits, '_', '.', ':', "
            "'/' or '-', not starting with a punctuation mark",
            path="$.name",
        )
    return name


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


def tick_key(name: str, tick: datetime.datetime) -> str:
    """The idempotency key of a schedule's tick: one task per (schedule, tick time)."""
    return f"schedule/{name}/{tick.astimezone(datetime.UTC).isoformat()}"


def check_settings(
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


def render_tick(
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
