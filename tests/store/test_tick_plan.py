"""The firing pass's policy, on fixed times: late is not missed, catch-up, overlap."""

from __future__ import annotations

import datetime

import pytest

from toolkit.definition.cadence import IntervalCadence, parse_cadence
from toolkit.store.tick_plan import GRACE, MAX_TICKS, plan_ticks

MINUTE = IntervalCadence(60.0)
T0 = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)


def at(minutes: float) -> datetime.datetime:
    return T0 + datetime.timedelta(minutes=minutes)


def test_a_late_tick_fires_once_and_the_next_is_the_following_one() -> None:
    plan = plan_ticks(MINUTE, at(0), (), at(0.5), live=0)
    assert (plan.start, plan.next_tick, plan.missed) == ((at(0),), at(1), 0)


def test_nothing_is_due_before_the_next_tick() -> None:
    plan = plan_ticks(MINUTE, at(1), (), at(0.5), live=0)
    assert (plan.start, plan.next_tick) == ((), at(1))


@pytest.mark.parametrize(
    ("catchup", "window", "start", "missed", "caught_up"),
    [
        # Down from 12:00 to 12:10:30: ticks 12:00 ... 12:10; only 12:10 is within a minute.
        ("none", None, [10], 10, 0),
        ("latest", None, [9, 10], 9, 1),
        ("all", 300.0, [6, 7, 8, 9, 10], 6, 4),
    ],
)
def test_catch_up_after_downtime(
    catchup: str, window: float | None, start: list[int], missed: int, caught_up: int
) -> None:
    plan = plan_ticks(MINUTE, at(0), (), at(10.5), 0, catchup=catchup, window=window,
                      overlap="allow_all")  # type: ignore[arg-type]  # fmt: skip
    assert list(plan.start) == [at(m) for m in start]
    assert (plan.missed, plan.caught_up, plan.next_tick) == (missed, caught_up, at(11))


def test_a_day_of_one_second_ticks_is_counted_not_walked() -> None:
    every_second = IntervalCadence(1.0)
    day = datetime.timedelta(days=1)
    plan = plan_ticks(every_second, T0, (), T0 + day, 0, overlap="allow_all")
    late = int(GRACE)  # the ticks of the last minute fire as late
    assert len(plan.start) == late + 1  # and the latest missed one, caught up
    # 86,401 ticks from T0 to T0 + 1 day, both included; one at the minute's edge is missed.
    assert plan.missed == 86_401 - late - 1 and plan.caught_up == 1
    assert plan.next_tick == T0 + day + datetime.timedelta(seconds=1)
    assert len(plan.start) <= MAX_TICKS


@pytest.mark.parametrize(
    ("overlap", "live", "buffered", "start", "kept", "skipped", "cancel"),
    [
        ("skip", 1, [], [], [], 2, False),
        ("skip", 0, [], [9.5], [], 1, False),
        ("buffer_one", 1, [], [], [9.5], 1, False),
        ("buffer_one", 0, [8], [8], [9.5], 1, False),
        ("buffer_all", 1, [8], [], [8, 9.5, 10], 0, False),
        ("cancel_other", 1, [], [10], [], 1, True),
        ("allow_all", 3, [], [9.5, 10], [], 0, False),
    ],
)
def test_overlap_policies(
    overlap: str, live: int, buffered: list[float], start: list[float], kept: list[float],
    skipped: int, cancel: bool,
) -> None:  # fmt: skip
    every_half = IntervalCadence(30.0)
    plan = plan_ticks(every_half, at(9.5), [at(b) for b in buffered], at(10.2), live,
                      overlap=overlap)  # type: ignore[arg-type]  # fmt: skip
    assert list(plan.start) == [at(s) for s in start]
    assert list(plan.buffered) == [at(k) for k in kept]
    assert (plan.skipped, plan.cancel_live) == (skipped, cancel)


def test_buffered_ticks_start_when_no_run_is_live_even_with_nothing_due() -> None:
    plan = plan_ticks(MINUTE, at(5), [at(1), at(2)], at(3), 0, overlap="buffer_all")
    assert (plan.start, plan.buffered, plan.next_tick) == ((at(1),), (at(2),), at(5))


def test_a_cron_after_a_long_downtime_finds_its_latest_missed_tick() -> None:
    nightly = parse_cadence(cron="30 2 * * *", timezone="Europe/Amsterdam")
    first = datetime.datetime(2026, 1, 1, 1, 30, tzinfo=datetime.UTC)  # 02:30 CET
    now = datetime.datetime(2026, 6, 1, 12, 0, tzinfo=datetime.UTC)
    plan = plan_ticks(nightly, first, (), now, 0)
    # The latest 02:30 before now: 1 June, 02:30 CEST = 00:30 UTC.
    assert plan.start == (datetime.datetime(2026, 6, 1, 0, 30, tzinfo=datetime.UTC),)
    assert plan.next_tick == datetime.datetime(2026, 6, 2, 0, 30, tzinfo=datetime.UTC)
    assert plan.missed == 151 and plan.caught_up == 1  # 152 nights, Jan 1 to Jun 1
