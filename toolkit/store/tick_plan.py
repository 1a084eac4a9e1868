"""What one firing pass does with a schedule's due ticks: pure policy, no database.

Given a schedule's cadence, its first unhandled tick (``next_tick``), the ticks it buffered,
the database's now and how many of its runs are live, :func:`plan_ticks` decides which ticks
start a task, which wait, which are skipped or missed, and the next tick (docs/schedules.md):

- **Late is not missed.** A tick less than :data:`GRACE` seconds old when a pass sees it (the
  workers were busy, or starting) is *late*: it fires, once. An older one was due while no
  worker ran: it is *missed*, and the catch-up policy decides: ``none`` fires none of them,
  ``latest`` (the default) the newest of them once, ``all`` every one no older than the
  schedule's catch-up window.
- **Overlap.** A tick that comes while a run of the schedule is live: ``skip`` (the default)
  drops it; ``buffer_one`` keeps one (the first) to start when no run is live, and drops the
  rest; ``buffer_all`` keeps each; ``cancel_other`` cancels the live runs and starts the
  newest tick; ``allow_all`` starts each.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from toolkit.definition.cadence import Cadence, IntervalCadence
from toolkit.definition.schedules import Catchup, Overlap

#: Seconds a tick may be late and still fire as late, not missed.
GRACE = 60.0
#: Most ticks one pass handles for one schedule; the rest are the next pass's.
MAX_TICKS = 1000



@dataclasses.dataclass(frozen=True)
class TickPlan:
    """What a pass does with one schedule.

    Attributes:
        start: the ticks that start a task now, oldest first.
        buffered: the ticks that wait for the live run to end (replacing those buffered).
        next_tick: the first tick the next pass handles.
        skipped: ticks dropped by the overlap policy.
        missed: ticks dropped by the catch-up policy.
        caught_up: missed ticks that fire all the same (catch-up ``latest`` or ``all``).
        cancel_live: cancel the live runs first (overlap ``cancel_other``).
    """

    start: tuple[datetime.datetime, ...]
    buffered: tuple[datetime.datetime, ...]
    next_tick: datetime.datetime
    skipped: int = 0
    missed: int = 0
    caught_up: int = 0
    cancel_live: bool = False


def plan_ticks(
    cadence: Cadence,
    next_tick: datetime.datetime,
    buffered: Sequence[datetime.datetime],
    now: datetime.datetime,
    live: int,
    *,
    overlap: Overlap = "skip",
    catchup: Catchup = "latest",
    window: float | None = None,
) -> TickPlan:
    """Decide a pass over one schedule.

    Ticks older than the catch-up reach (:data:`GRACE`, or the window of catch-up ``all``)
    are counted, not walked one by one past :data:`MAX_TICKS` (a one-second schedule after
    a day's downtime): the pass jumps to the reach.

    Args:
        cadence: when the schedule ticks.
        next_tick: its first tick not handled yet (after ``now``: only the buffered ticks
            are considered).
        buffered: ticks buffered by an earlier pass, oldest first.
        now: the database's time.
        live: how many runs of the schedule are live (queued, leased or waiting).
        overlap: the overlap policy.
        catchup: the catch-up policy.
        window: with catch-up ``all``, seconds: the oldest missed tick that still fires.

    Returns:
        The plan.
    """
    fire: list[datetime.datetime] = []
    missed = caught_up = 0
    following = next_tick
    if next_tick <= now:
        reach = max(window or 0.0, GRACE) if catchup == "all" else GRACE
        horizon = now - datetime.timedelta(seconds=reach)
        start = next_tick
        if next_tick <= horizon:  # missed: no worker ran while these were due
            older = [next_tick, *cadence.ticks(next_tick, horizon, MAX_TICKS)]
            newest = older[-1] if len(older) <= MAX_TICKS else _last_before(cadence, horizon)
            missed = len(older) if len(older) <= MAX_TICKS else _count(cadence, older, horizon)
            if catchup == "latest":
                fire.append(newest)
                missed, caught_up = missed - 1, 1
            start = horizon
            due = cadence.ticks(start, now, MAX_TICKS)
        else:
            due = [next_tick, *cadence.ticks(next_tick, now, MAX_TICKS - 1)]
        if catchup == "all":
            caught_up += sum(1 for t in due if (now - t).total_seconds() > GRACE)
        fire += due
        following = cadence.next_after(due[-1] if due else start)
    return _overlap(fire, buffered, following, live, overlap, missed, caught_up)


def _overlap(
    fire: list[datetime.datetime],
    buffered: Sequence[datetime.datetime],
    following: datetime.datetime,
    live: int,
    overlap: Overlap,
    missed: int,
    caught_up: int,
) -> TickPlan:
    """The plan once the overlap policy has decided which ticks start, wait or are dropped."""
    queue = [*buffered, *fire]
    if overlap == "allow_all":
        return TickPlan(tuple(queue), (), following, 0, missed, caught_up)
    if overlap == "cancel_other":
        if not queue:
            return TickPlan((), (), following, 0, missed, caught_up)
        return TickPlan(
            (queue[-1],), (), following, len(queue) - 1, missed, caught_up, cancel_live=live > 0
        )
    start: list[datetime.datetime] = []
    if live == 0 and queue:
        start, queue = queue[:1], queue[1:]
    kept = [] if overlap == "skip" else queue[:1] if overlap == "buffer_one" else queue
    return TickPlan(tuple(start), tuple(kept), following, len(queue) - len(kept), missed, caught_up)


def _last_before(cadence: Cadence, moment: datetime.datetime) -> datetime.datetime:
    """The newest tick at or before ``moment``: searched in windows growing backwards."""
    span = datetime.timedelta(minutes=1)
    while True:
        found = cadence.ticks(moment - span, moment, MAX_TICKS)
        if found:
            while len(found) == MAX_TICKS:  # dense: walk on to the last one
                found = cadence.ticks(found[-1], moment, MAX_TICKS) or found[-1:]
            return found[-1]
        span *= 8


def _count(
    cadence: Cadence, first: Sequence[datetime.datetime], moment: datetime.datetime
) -> int:
    """How many ticks there are from ``first[0]`` to ``moment``.

    ``first`` is the earliest of them, a full page: the count is exact for an interval, and
    that page's (a lower bound) for a cron.
    """
    if isinstance(cadence, IntervalCadence):
        return int((moment - first[0]).total_seconds() // cadence.every_seconds) + 1
    return len(first)
