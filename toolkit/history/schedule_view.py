"""One schedule as the schedule board shows it: its next fire times and recent runs.

:class:`ScheduleRow` gathers a schedule as stored, the database's time it was read at, its
next fire times (:func:`next_fires`, from its cadence) and its most recent runs (the tasks
``TaskFilter(schedule=NAME)`` finds, newest first). ``text()`` is what docs and tests
compare, ``html()`` one row of the board (``schedule_board.css`` styles it); both come from
:meth:`ScheduleRow.fields`. Times are shown on the wall clock of the schedule's time zone
(UTC for an interval), as its cron is read. Nothing here needs ipywidgets.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
from collections.abc import Sequence
from pathlib import Path
from zoneinfo import ZoneInfo

from toolkit.definition.cadence import CronCadence
from toolkit.history.task_detail import STATE_COLOURS
from toolkit.store import Store
from toolkit.store.schedules import Schedule
from toolkit.store.tasks import TaskRecord

#: The stylesheet of the board's rows (JupyterLab's theme colours, with fallbacks).
STYLESHEET = Path(__file__).resolve().parent / "schedule_board.css"
_UTC = ZoneInfo("UTC")


def next_fires(
    schedule: Schedule, now: datetime.datetime, count: int
) -> tuple[datetime.datetime, ...]:
    """The next ``count`` times a schedule fires, from its cadence.

    Args:
        schedule: the schedule as stored.
        now: the database's time.
        count: how many (0 or more).

    Returns:
        Aware UTC datetimes, ascending. An active schedule starts from its next tick, which
        is due already when it is not after ``now`` (no worker fired it yet); the rest are
        the ticks after both. A paused schedule fires nothing: its times are those a resume
        at ``now`` would go on from (the ticks after ``now``).
    """
    if count <= 0:
        return ()
    first = schedule.cadence.next_after(now) if schedule.paused else schedule.next_tick
    ticks = [first.astimezone(datetime.UTC)]
    after = max(first, now)
    while len(ticks) < count:
        after = schedule.cadence.next_after(after)
        ticks.append(after)
    return tuple(ticks)


async def read_rows(store: Store, *, upcoming: int = 3, runs: int = 5) -> list[ScheduleRow]:
    """Every schedule of a store as a board row, by name.

    Args:
        store: an open store.
        upcoming: next fire times per schedule.
        runs: recent runs per schedule (one ``store.tasks.list`` each).
    """
    now = await store.tasks.database_now()
    rows = []
    for schedule in await store.schedules.list():
        recent = await store.tasks.list(schedule=schedule.name, limit=runs) if runs > 0 else []
        rows.append(ScheduleRow(schedule, now, next_fires(schedule, now, upcoming), tuple(recent)))
    return rows


@dataclasses.dataclass(frozen=True)
class ScheduleRow:
    """One schedule on the board.

    Attributes:
        schedule: the schedule as stored: cadence, pause note, tick counts, live runs.
        now: the database's time when it was read.
        upcoming: its next fire times (:func:`next_fires`), aware UTC datetimes.
        runs: its most recent runs, newest first.
    """

    schedule: Schedule
    now: datetime.datetime
    upcoming: tuple[datetime.datetime, ...]
    runs: tuple[TaskRecord, ...]

    @property
    def name(self) -> str:
        """The schedule's name."""
        return self.schedule.name

    @property
    def zone(self) -> ZoneInfo:
        """The zone its times are shown in: a cron's, UTC for an interval."""
        cadence = self.schedule.cadence
        return cadence.zone if isinstance(cadence, CronCadence) else _UTC

    @property
    def owner(self) -> str:
        """Who owns it: ``store`` (made at run time) or its definition's YAML."""
        s = self.schedule
        if s.owner == "store" or s.owner_version is None:
            return s.owner
        return f"{s.owner} ({s.definition_name} v{s.owner_version})"

    def moment(self, when: datetime.datetime) -> str:
        """A time on the schedule's wall clock: ``Mon 2026-12-07 06:00:00 CET``."""
        return f"{when.astimezone(self.zone):%a %Y-%m-%d %H:%M:%S %Z}"

    def fire_texts(self) -> list[str]:
        """Its next fire times, each with how far off it is (``due`` once passed)."""
        return [
            f"{self.moment(t)} ({_until((t - self.now).total_seconds())})" for t in self.upcoming
        ]

    def started(self, run: TaskRecord) -> str:
        """How and when a run started: ``tick Mon 2026-12-07 06:00:00 CET`` or ``triggered ...``."""
        manual = (run.idempotency_key or "").startswith(f"schedule/{self.name}/manual/")
        when = self.moment(run.scheduled_at or run.created_at)
        return f"triggered {when}" if manual else f"tick {when}"

    def run_text(self, run: TaskRecord) -> str:
        """A run in a line: ``task 7 succeeded, tick Mon 2026-12-07 06:00:00 CET``."""
        state = run.state + (f" ({run.wait_reason})" if run.wait_reason else "")
        return f"task {run.id} {state}, {self.started(run)}"

    def fields(self) -> list[tuple[str, list[str]]]:
        """The row as ``(label, lines)`` pairs.

        The labels: ``schedule``, ``cadence``, ``state``, ``next fires`` (``if resumed``
        when paused), ``ticks`` and ``recent runs``.
        """
        s = self.schedule
        cadence = s.cadence
        catchup = s.catchup if s.catchup != "all" else f"all within {s.catchup_window:g} s"
        state = [f"paused: {s.pause_note}" if s.paused else "active"]
        if s.consecutive_failures or s.pause_after_failures:
            limit = f" (pauses at {s.pause_after_failures})" if s.pause_after_failures else ""
            state.append(f"{s.consecutive_failures} failed in a row{limit}")
        where = [s.name, f"{s.definition_name} (tenant {s.tenant})", f"owner {self.owner}"]
        how = [
            f'cron "{cadence.expression}"'
            if isinstance(cadence, CronCadence)
            else cadence.describe(),
            f"time zone {self.zone.key}",
            f"overlap {s.overlap}, catch-up {catchup}",
        ]
        ticks = [
            f"live runs {s.live}" + (f", {len(s.buffered)} buffered" if s.buffered else ""),
            f"fired {s.fired}, skipped {s.skipped}",
            f"missed {s.missed}, caught up {s.caught_up}",
        ]
        return [
            ("schedule", where),
            ("cadence", how),
            ("state", state),
            ("if resumed" if s.paused else "next fires", self.fire_texts()),
            ("ticks", ticks),
            ("recent runs", [self.run_text(run) for run in self.runs] or ["none yet"]),
        ]

    def text(self) -> str:
        """The row as plain text: its description, owner, state, next fires, ticks and runs."""
        lines = [f"schedule {self.name}: {self.schedule.describe()}"]
        for label, values in [("owner", [self.owner]), *self.fields()[2:]]:
            for index, value in enumerate(values):
                lines.append(f"  {(label + ':') if index == 0 else '':<13} {value}")
        return "\n".join(lines)

    def html(self) -> str:
        """The row as HTML: a title line, then its next fires, ticks and runs side by side.

        ``div.toolkit-schedule`` (``data-schedule`` its name), styled by the stylesheet of
        :func:`style_html`: the state is a badge (green active, grey paused), each recent
        run a badge of its task state; a fire time that is due is marked.
        """
        esc = html.escape
        s, fields = self.schedule, dict(self.fields())
        kind = "paused" if s.paused else "active"
        name, definition, owner = fields["schedule"]
        title = (
            f"<div class='toolkit-schedule-title'><b>{esc(name)}</b> "
            f"<span class='toolkit-schedule-badge toolkit-schedule-{kind}'>{kind}</span> "
            f"<span class='toolkit-schedule-muted'>{esc(definition)}, {esc(owner)}</span></div>"
            + _muted(" · ".join(fields["cadence"]))
            + "".join(_line(line) for line in fields["state"] if line != "active")
        )
        fires = "".join(
            f"<div class='toolkit-schedule-{'due' if t <= self.now else 'fire'}'>{esc(text)}</div>"
            for t, text in zip(self.upcoming, self.fire_texts(), strict=True)
        )
        runs = "".join(_run_html(self, run) for run in self.runs) or _muted("none yet")
        cells = (
            _cell("next fires if resumed" if s.paused else "next fires", fires)
            + _cell("ticks", "".join(_line(line) for line in fields["ticks"]))
            + _cell("recent runs", runs)
        )
        return (
            f"<div class='toolkit-schedule' data-schedule='{esc(self.name)}'>{title}"
            f"<div class='toolkit-schedule-cells'>{cells}</div></div>"
        )


def style_html() -> str:
    """The board's stylesheet as a ``<style>`` element (``schedule_board.css``)."""
    return f"<style>{STYLESHEET.read_text(encoding='utf-8')}</style>"


def rows_text(rows: Sequence[ScheduleRow]) -> str:
    """Rows as plain text, a blank line between them (``no schedules`` when none)."""
    return "\n\n".join(row.text() for row in rows) or "no schedules"


def _muted(text: str) -> str:
    return f"<div class='toolkit-schedule-muted'>{html.escape(text)}</div>"


def _line(text: str) -> str:
    return f"<div>{html.escape(text)}</div>"


def _cell(label: str, inner: str) -> str:
    return (
        f"<div class='toolkit-schedule-cell'><div class='toolkit-schedule-label'>"
        f"{html.escape(label)}</div>{inner}</div>"
    )


def _run_html(row: ScheduleRow, run: TaskRecord) -> str:
    """A run: its id, a badge of its state, and how and when it started."""
    colour = STATE_COLOURS.get(run.state, "#616161")
    return (
        f"<div class='toolkit-schedule-run' data-task='{run.id}'>task {run.id} "
        f"<span class='toolkit-schedule-badge' style='background:{colour}'>"
        f"{html.escape(run.state)}</span> <span class='toolkit-schedule-muted'>"
        f"{html.escape(row.started(run))}</span></div>"
    )


def _until(seconds: float) -> str:
    """How far off a moment is: ``in 3d 4h``, ``in 12m 5s``, ``in 42s``; ``due`` once passed."""
    if seconds <= 0:
        return "due"
    whole = int(seconds)
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for index, (unit, size) in enumerate(units):
        if whole >= size:
            text = f"{whole // size}{unit}"
            if index + 1 < len(units):
                smaller, step = units[index + 1]
                rest = whole % size // step
                text += f" {rest}{smaller}" if rest else ""
            return f"in {text}"
    return "in under 1s"
