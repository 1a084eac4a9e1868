"""Schedule ticks (issue 17): cron and interval cadences, across daylight saving time.

Every expected tick below was worked out by hand from the zones' rules, never by asking
the library. The facts used:

- 2026-03-01 is a Sunday (2026-01-01 is a Thursday; January has 31 days, so 2026-02-01 is a
  Sunday, and February has 28, so 2026-03-01 is one too). Hence the Sundays 2026-03-08
  (second in March), 2026-03-29 (last in March); April 1 is a Wednesday, ..., October 1 a
  Thursday, so 2026-10-25 is October's last Sunday and 2026-11-01 November's first.
- Europe/Amsterdam: CET is UTC+1, CEST UTC+2. Summer time starts on the last Sunday of
  March at 01:00 UTC (02:00 CET jumps to 03:00 CEST: local 02:00-02:59 does not exist) and
  ends on the last Sunday of October at 01:00 UTC (03:00 CEST goes back to 02:00 CET: local
  02:00-02:59 happens twice, first at 00:xx UTC, then at 01:xx UTC).
- America/New_York: EST is UTC-5, EDT UTC-4. Summer time starts on the second Sunday of
  March at 07:00 UTC (02:00 EST jumps to 03:00 EDT: local 02:xx does not exist) and ends on
  the first Sunday of November at 06:00 UTC (02:00 EDT goes back to 01:00 EST: local 01:xx
  happens twice, first at 05:xx UTC, then at 06:xx UTC).
"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.definition.cadence import (
    ALIASES,
    CronCadence,
    IntervalCadence,
    parse_cadence,
)
from toolkit.errors import InputError

AMS = "Europe/Amsterdam"
NYC = "America/New_York"


def utc(text: str) -> datetime:
    """``2026-03-29T01:00`` (or with seconds/microseconds) as an aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def local(moment: datetime, zone: str) -> str:
    """A tick as the zone's wall clock shows it: ``03:00+0200``."""
    return moment.astimezone(ZoneInfo(zone)).strftime("%H:%M%z")


# --- daily crons on the four transition days --------------------------------------------------

#: (cron, zone, window start, window end, the ticks in the window in UTC). Each window runs
#: from noon UTC two days before the transition day to noon UTC the day after it, so it
#: holds the day before, the transition day and the day after.
DAILY = [
    # Amsterdam, spring forward, Sunday 2026-03-29.
    pytest.param(
        "30 2 * * *", AMS, "2026-03-27T12:00", "2026-03-30T12:00",
        [
            "2026-03-28T01:30",  # Sat 02:30 CET (UTC+1)
            "2026-03-29T01:00",  # Sun: no 02:30; the first instant after the gap, 03:00 CEST
            "2026-03-30T00:30",  # Mon 02:30 CEST (UTC+2)
        ],
        id="ams-spring-0230",
    ),
    pytest.param(
        "30 1 * * *", AMS, "2026-03-27T12:00", "2026-03-30T12:00",
        [
            "2026-03-28T00:30",  # Sat 01:30 CET
            "2026-03-29T00:30",  # Sun 01:30 CET: before the gap, unaffected
            "2026-03-29T23:30",  # Mon 01:30 CEST is Sunday 23:30 UTC
        ],
        id="ams-spring-0130",
    ),
    pytest.param(
        "@daily", AMS, "2026-03-27T12:00", "2026-03-30T12:00",
        [
            "2026-03-27T23:00",  # Sat 00:00 CET
            "2026-03-28T23:00",  # Sun 00:00 CET
            "2026-03-29T22:00",  # Mon 00:00 CEST
        ],
        id="ams-spring-daily",
    ),
    # Amsterdam, fall back, Sunday 2026-10-25.
    pytest.param(
        "30 2 * * *", AMS, "2026-10-23T12:00", "2026-10-26T12:00",
        [
            "2026-10-24T00:30",  # Sat 02:30 CEST
            "2026-10-25T00:30",  # Sun: the first 02:30 (CEST, fold=0) only; not 01:30 UTC (CET)
            "2026-10-26T01:30",  # Mon 02:30 CET
        ],
        id="ams-fall-0230",
    ),
    pytest.param(
        "30 1 * * *", AMS, "2026-10-23T12:00", "2026-10-26T12:00",
        [
            "2026-10-23T23:30",  # Sat 01:30 CEST is Friday 23:30 UTC
            "2026-10-24T23:30",  # Sun 01:30 CEST: before the change at 03:00 CEST, once
            "2026-10-26T00:30",  # Mon 01:30 CET
        ],
        id="ams-fall-0130",
    ),
    pytest.param(
        "@daily", AMS, "2026-10-23T12:00", "2026-10-26T12:00",
        [
            "2026-10-23T22:00",  # Sat 00:00 CEST
            "2026-10-24T22:00",  # Sun 00:00 CEST
            "2026-10-25T23:00",  # Mon 00:00 CET
        ],
        id="ams-fall-daily",
    ),
    # New York, spring forward, Sunday 2026-03-08.
    pytest.param(
        "30 2 * * *", NYC, "2026-03-06T12:00", "2026-03-09T12:00",
        [
            "2026-03-07T07:30",  # Sat 02:30 EST (UTC-5)
            "2026-03-08T07:00",  # Sun: 02:30 does not exist; 03:00 EDT, the first instant after
            "2026-03-09T06:30",  # Mon 02:30 EDT (UTC-4)
        ],
        id="nyc-spring-0230",
    ),
    pytest.param(
        "30 1 * * *", NYC, "2026-03-06T12:00", "2026-03-09T12:00",
        [
            "2026-03-07T06:30",  # Sat 01:30 EST
            "2026-03-08T06:30",  # Sun 01:30 EST: before the gap
            "2026-03-09T05:30",  # Mon 01:30 EDT
        ],
        id="nyc-spring-0130",
    ),
    pytest.param(
        "@daily", NYC, "2026-03-06T12:00", "2026-03-09T12:00",
        [
            "2026-03-07T05:00",  # Sat 00:00 EST
            "2026-03-08T05:00",  # Sun 00:00 EST
            "2026-03-09T04:00",  # Mon 00:00 EDT
        ],
        id="nyc-spring-daily",
    ),
    # New York, fall back, Sunday 2026-11-01.
    pytest.param(
        "30 2 * * *", NYC, "2026-10-30T12:00", "2026-11-02T12:00",
        [
            "2026-10-31T06:30",  # Sat 02:30 EDT
            "2026-11-01T07:30",  # Sun 02:30 EST: the repeated hour is 01:xx, so 02:30 is once
            "2026-11-02T07:30",  # Mon 02:30 EST
        ],
        id="nyc-fall-0230",
    ),
    pytest.param(
        "30 1 * * *", NYC, "2026-10-30T12:00", "2026-11-02T12:00",
        [
            "2026-10-31T05:30",  # Sat 01:30 EDT
            "2026-11-01T05:30",  # Sun: the first 01:30 (EDT, fold=0) only; not 06:30 UTC (EST)
            "2026-11-02T06:30",  # Mon 01:30 EST
        ],
        id="nyc-fall-0130",
    ),
    pytest.param(
        "@daily", NYC, "2026-10-30T12:00", "2026-11-02T12:00",
        [
            "2026-10-31T04:00",  # Sat 00:00 EDT
            "2026-11-01T04:00",  # Sun 00:00 EDT
            "2026-11-02T05:00",  # Mon 00:00 EST
        ],
        id="nyc-fall-daily",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("cron", "zone", "start", "end", "expected"), DAILY)
def test_a_daily_cron_fires_once_a_day_across_dst(
    cron: str, zone: str, start: str, end: str, expected: list[str]
) -> None:
    cadence = parse_cadence(cron=cron, timezone=zone)
    assert cadence.ticks(utc(start), utc(end), 10) == [utc(t) for t in expected]
    # And one tick at a time, each from the one before.
    walked, moment = [], utc(start)
    for _ in expected:
        moment = cadence.next_after(moment)
        walked.append(moment)
    assert walked == [utc(t) for t in expected]


def test_spring_forward_fires_at_the_first_instant_after_the_gap() -> None:
    assert local(utc("2026-03-29T01:00"), AMS) == "03:00+0200"
    assert local(utc("2026-03-08T07:00"), NYC) == "03:00-0400"
    # 02:00 itself, the first minute of the gap, goes to 03:00 too.
    nyc = parse_cadence(cron="0 2 * * *", timezone=NYC)
    assert nyc.next_after(utc("2026-03-08T00:00")) == utc("2026-03-08T07:00")


def test_several_times_in_the_gap_fire_once_together() -> None:
    # 02:00 and 02:30 both fall in Amsterdam's gap: one tick at 03:00 CEST (01:00 UTC).
    cadence = parse_cadence(cron="0,30 2 * * *", timezone=AMS)
    assert cadence.ticks(utc("2026-03-28T12:00"), utc("2026-03-29T12:00"), 10) == [
        utc("2026-03-29T01:00")
    ]
    # On the fall-back day they fire once each, in the first (summer) pass: 02:00 and 02:30
    # CEST are 00:00 and 00:30 UTC; the CET pass (01:00, 01:30 UTC) does not fire.
    assert cadence.ticks(utc("2026-10-24T12:00"), utc("2026-10-25T12:00"), 10) == [
        utc("2026-10-25T00:00"),
        utc("2026-10-25T00:30"),
    ]


def test_an_hour_range_is_wall_clock_too() -> None:
    # Minute and hour both specific: each named hour fires once a day, on the wall clock.
    cadence = parse_cadence(cron="0 1-5 * * *", timezone=AMS)
    # Spring: 01:00 CET = 00:00Z; 02:00 is in the gap and moves to 03:00 CEST = 01:00Z, the
    # same instant as 03:00 itself, so one tick; 04:00 CEST = 02:00Z; 05:00 CEST = 03:00Z.
    assert cadence.ticks(utc("2026-03-28T12:00"), utc("2026-03-29T12:00"), 10) == [
        utc("2026-03-29T00:00"),
        utc("2026-03-29T01:00"),
        utc("2026-03-29T02:00"),
        utc("2026-03-29T03:00"),
    ]
    # Fall: 01:00 CEST = 23:00Z Sat; 02:00 CEST = 00:00Z; 02:00 CET (01:00Z) does not fire;
    # 03:00 CET = 02:00Z; 04:00 CET = 03:00Z; 05:00 CET = 04:00Z.
    assert cadence.ticks(utc("2026-10-24T12:00"), utc("2026-10-25T12:00"), 10) == [
        utc("2026-10-24T23:00"),
        utc("2026-10-25T00:00"),
        utc("2026-10-25T02:00"),
        utc("2026-10-25T03:00"),
        utc("2026-10-25T04:00"),
    ]


# --- hourly and sub-hourly crons: real time -------------------------------------------------

#: (zone, window start, window end, [(tick in UTC, the zone's wall clock at it)]).
HOURLY = [
    # Amsterdam spring: 00:00Z is 01:00 CET; at 01:00Z the clock reads 03:00 CEST.
    pytest.param(
        AMS, "2026-03-28T23:30", "2026-03-29T02:30",
        [("2026-03-29T00:00", "01:00+0100"), ("2026-03-29T01:00", "03:00+0200"),
         ("2026-03-29T02:00", "04:00+0200")],
        id="ams-spring",
    ),
    # Amsterdam fall: 02:00 twice, an hour apart (00:00Z CEST, then 01:00Z CET).
    pytest.param(
        AMS, "2026-10-24T23:30", "2026-10-25T02:30",
        [("2026-10-25T00:00", "02:00+0200"), ("2026-10-25T01:00", "02:00+0100"),
         ("2026-10-25T02:00", "03:00+0100")],
        id="ams-fall",
    ),
    # New York spring: 06:00Z is 01:00 EST; at 07:00Z the clock reads 03:00 EDT.
    pytest.param(
        NYC, "2026-03-08T05:30", "2026-03-08T08:30",
        [("2026-03-08T06:00", "01:00-0500"), ("2026-03-08T07:00", "03:00-0400"),
         ("2026-03-08T08:00", "04:00-0400")],
        id="nyc-spring",
    ),
    # New York fall: 01:00 twice (05:00Z EDT, then 06:00Z EST).
    pytest.param(
        NYC, "2026-11-01T04:30", "2026-11-01T07:30",
        [("2026-11-01T05:00", "01:00-0400"), ("2026-11-01T06:00", "01:00-0500"),
         ("2026-11-01T07:00", "02:00-0500")],
        id="nyc-fall",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("zone", "start", "end", "expected"), HOURLY)
@pytest.mark.parametrize("cron", ["0 * * * *", "@hourly"])
def test_an_hourly_cron_fires_once_per_real_hour(
    cron: str, zone: str, start: str, end: str, expected: list[tuple[str, str]]
) -> None:
    ticks = parse_cadence(cron=cron, timezone=zone).ticks(utc(start), utc(end), 10)
    assert [(t, local(t, zone)) for t in ticks] == [(utc(t), wall) for t, wall in expected]


@pytest.mark.parametrize(
    ("zone", "midnight", "next_midnight", "hours"),
    [
        # The local day runs from one local midnight to the next; both zones' offsets are
        # whole hours, so the hourly ticks are every UTC hour from the first midnight on.
        (AMS, "2026-03-28T23:00", "2026-03-29T22:00", 23),  # 00:00 CET .. 00:00 CEST
        (AMS, "2026-10-24T22:00", "2026-10-25T23:00", 25),  # 00:00 CEST .. 00:00 CET
        (NYC, "2026-03-08T05:00", "2026-03-09T04:00", 23),  # 00:00 EST .. 00:00 EDT
        (NYC, "2026-11-01T04:00", "2026-11-02T05:00", 25),  # 00:00 EDT .. 00:00 EST
    ],
)
def test_an_hourly_cron_loses_only_the_missing_hour_and_doubles_none(
    zone: str, midnight: str, next_midnight: str, hours: int
) -> None:
    cadence = parse_cadence(cron="0 * * * *", timezone=zone)
    second = timedelta(seconds=1)
    ticks = cadence.ticks(utc(midnight) - second, utc(next_midnight) - second, 100)
    assert ticks == [utc(midnight) + timedelta(hours=h) for h in range(hours)]


def test_quarter_hours_follow_real_time_through_both_transitions() -> None:
    cadence = parse_cadence(cron="*/15 * * * *", timezone=AMS)
    # Spring: 01:45 CET, then the clock jumps: 03:00, 03:15, 03:30 CEST, 15 real minutes apart.
    spring = cadence.ticks(utc("2026-03-29T00:30"), utc("2026-03-29T01:30"), 10)
    walls = ["01:45+0100", "03:00+0200", "03:15+0200", "03:30+0200"]
    assert [local(t, AMS) for t in spring] == walls
    assert spring == [utc(t) for t in ("2026-03-29T00:45", "2026-03-29T01:00",
                                       "2026-03-29T01:15", "2026-03-29T01:30")]  # fmt: skip
    # Fall: the repeated hour's quarter-hours fire again in its second (CET) pass.
    fall = cadence.ticks(utc("2026-10-25T00:30"), utc("2026-10-25T01:30"), 10)
    walls = ["02:45+0200", "02:00+0100", "02:15+0100", "02:30+0100"]
    assert [local(t, AMS) for t in fall] == walls
    assert fall == [utc(t) for t in ("2026-10-25T00:45", "2026-10-25T01:00",
                                     "2026-10-25T01:15", "2026-10-25T01:30")]  # fmt: skip


# --- next_after from inside a repeated hour ---------------------------------------------------


def test_next_after_from_the_second_pass_of_a_repeated_hour_is_tomorrow() -> None:
    # 01:10 UTC on 2026-10-25 is 02:10 CET, the second pass: today's 02:30 fired at 00:30 UTC
    # (CEST), already past, so the next is Monday's 02:30 CET = 01:30 UTC.
    ams = parse_cadence(cron="30 2 * * *", timezone=AMS)
    assert ams.next_after(utc("2026-10-25T01:10")) == utc("2026-10-26T01:30")
    # In the first pass (00:10 UTC = 02:10 CEST) it is today's, 20 minutes later.
    assert ams.next_after(utc("2026-10-25T00:10")) == utc("2026-10-25T00:30")
    # New York: 06:10 UTC is 01:10 EST (second pass); 05:10 UTC is 01:10 EDT (first).
    nyc = parse_cadence(cron="30 1 * * *", timezone=NYC)
    assert nyc.next_after(utc("2026-11-01T06:10")) == utc("2026-11-02T06:30")
    assert nyc.next_after(utc("2026-11-01T05:10")) == utc("2026-11-01T05:30")


def test_next_after_the_moved_tick_is_the_next_day() -> None:
    cadence = parse_cadence(cron="30 2 * * *", timezone=AMS)
    assert cadence.next_after(utc("2026-03-29T00:59:59")) == utc("2026-03-29T01:00")
    assert cadence.next_after(utc("2026-03-29T01:00")) == utc("2026-03-30T00:30")


# --- intervals: DST has no effect -------------------------------------------------------------


def test_every_15m_ticks_on_utc_quarter_hours_through_the_gap() -> None:
    # 900 s divides a day and the epoch is at 00:00 UTC: ticks at :00, :15, :30, :45 UTC.
    cadence = parse_cadence(every="15m")
    assert cadence.ticks(utc("2026-03-29T00:50"), utc("2026-03-29T01:20"), 10) == [
        utc("2026-03-29T01:00"),
        utc("2026-03-29T01:15"),
    ]
    # Amsterdam's 25-hour fall-back day (22:00Z to 23:00Z next day) holds 25 x 4 ticks.
    day = cadence.ticks(utc("2026-10-24T22:00"), utc("2026-10-25T23:00"), 1000)
    assert len(day) == 100
    assert all(b - a == timedelta(minutes=15) for a, b in itertools.pairwise(day))


def test_every_1h_offset_5m_ticks_at_five_past_each_utc_hour() -> None:
    # 3600 s divides a day: ticks at hh:05 UTC, through New York's repeated 01:xx.
    cadence = parse_cadence(every="1h", offset="5m")
    assert cadence.ticks(utc("2026-11-01T05:00"), utc("2026-11-01T08:00"), 10) == [
        utc("2026-11-01T05:05"),
        utc("2026-11-01T06:05"),
        utc("2026-11-01T07:05"),
    ]
    assert cadence == IntervalCadence(3600.0, 300.0)


def test_every_7s_counts_from_the_epoch() -> None:
    # 2026-01-01 is day 56 x 365 + 14 leap days (1972 .. 2024) = 20454 after the epoch, and
    # 2026-03-29 is 31 + 28 + 28 = 87 days later: day 20541. A day is 86400 s ≡ 6 (mod 7)
    # and 20541 ≡ 3 (mod 7), so its midnight is ≡ 18 ≡ 4; 01:00 adds 3600 ≡ 2: 01:00:00Z is
    # ≡ 6 (mod 7), one second short of a multiple of 7. Ticks at 01:00:01, :08, :15 UTC.
    cadence = parse_cadence(every="7s")
    assert cadence.ticks(utc("2026-03-29T00:59:55"), utc("2026-03-29T01:00:15"), 10) == [
        utc("2026-03-29T01:00:01"),
        utc("2026-03-29T01:00:08"),
        utc("2026-03-29T01:00:15"),
    ]
    # 2026-10-25 is 210 = 30 x 7 days later (297 - 87), so 01:00:00Z there is ≡ 6 as well.
    assert cadence.ticks(utc("2026-10-25T00:59:55"), utc("2026-10-25T01:00:15"), 10) == [
        utc("2026-10-25T01:00:01"),
        utc("2026-10-25T01:00:08"),
        utc("2026-10-25T01:00:15"),
    ]


def test_an_interval_does_not_depend_on_the_moments_zone() -> None:
    # 06:30 at UTC+05:30 is 01:00 UTC; in New York's EST it is 20:00 the day before.
    india = datetime(2026, 3, 29, 6, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    new_york = datetime(2026, 3, 28, 21, 0, tzinfo=ZoneInfo(NYC))
    cadence = parse_cadence(every="15m")
    assert cadence.next_after(india) == cadence.next_after(new_york) == utc("2026-03-29T01:15")


def test_every_1d_ticks_at_utc_midnight() -> None:
    assert parse_cadence(every="1d").next_after(utc("2026-03-29T00:00")) == utc("2026-03-30T00:00")


# --- next_after and ticks ---------------------------------------------------------------------


def test_next_after_exactly_at_a_tick_returns_the_next() -> None:
    interval = parse_cadence(every="15m")
    assert interval.next_after(utc("2026-03-29T01:00")) == utc("2026-03-29T01:15")
    assert interval.next_after(utc("2026-03-29T00:59:59.999999")) == utc("2026-03-29T01:00")
    cron = parse_cadence(cron="@hourly")
    assert cron.next_after(utc("2026-03-29T10:00")) == utc("2026-03-29T11:00")
    assert cron.next_after(utc("2026-03-29T09:59:59.999999")) == utc("2026-03-29T10:00")
    assert cron.next_after(utc("2026-03-29T10:00:00.000001")) == utc("2026-03-29T11:00")
    daily = parse_cadence(cron="30 2 * * *", timezone=AMS)
    assert daily.next_after(utc("2026-03-30T00:30")) == utc("2026-03-31T00:30")


def test_moments_out_are_utc_whatever_the_zone_in() -> None:
    moment = datetime(2026, 3, 29, 15, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    for cadence in (parse_cadence(cron="0 * * * *", timezone=AMS), parse_cadence(every="1h")):
        tick = cadence.next_after(moment)
        assert tick == utc("2026-03-29T11:00")  # 15:30 at +05:30 is 10:00 UTC
        assert tick.tzinfo is UTC


@pytest.mark.parametrize(
    "cadence", [parse_cadence(cron="@hourly"), parse_cadence(every="1h")], ids=["cron", "every"]
)
def test_ticks_over_a_range_honour_the_limit(cadence: CronCadence | IntervalCadence) -> None:
    start, end = utc("2026-03-29T00:00"), utc("2026-03-30T00:00")
    hour = timedelta(hours=1)
    # (start, end]: 01:00 .. 24:00, 24 ticks; start itself is out, end itself is in.
    assert cadence.ticks(start, end, 100) == [start + h * hour for h in range(1, 25)]
    first = cadence.ticks(start, end, 5)
    assert first == [start + h * hour for h in range(1, 6)]
    # Past the limit, the rest are had by going on from the last tick returned.
    assert cadence.ticks(first[-1], end, 5) == [start + h * hour for h in range(6, 11)]
    assert cadence.ticks(start, end, 0) == []
    assert cadence.ticks(end, start, 5) == []
    assert cadence.ticks(start, start, 5) == []
    with pytest.raises(ValueError, match="limit must be 0 or more"):
        cadence.ticks(start, end, -1)


@pytest.mark.parametrize("cadence", [parse_cadence(cron="@hourly"), parse_cadence(every="1h")])
def test_naive_moments_are_refused(cadence: CronCadence | IntervalCadence) -> None:
    naive = datetime(2026, 3, 29, 1, 0)
    with pytest.raises(ValueError, match="moment must be an aware datetime"):
        cadence.next_after(naive)
    with pytest.raises(ValueError, match="start must be an aware datetime"):
        cadence.ticks(naive, utc("2026-03-30T00:00"), 5)
    with pytest.raises(ValueError, match="end must be an aware datetime"):
        cadence.ticks(utc("2026-03-30T00:00"), naive, 5)


# --- aliases, syntax, text --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "after", "expected"),
    [
        # 2026-03-29 is a Sunday (see the module docstring); from Saturday noon UTC:
        ("@hourly", "2026-03-28T12:00", "2026-03-28T13:00"),
        ("@daily", "2026-03-28T12:00", "2026-03-29T00:00"),
        ("@midnight", "2026-03-28T12:00", "2026-03-29T00:00"),
        ("@weekly", "2026-03-28T12:00", "2026-03-29T00:00"),  # Sunday 00:00
        ("@monthly", "2026-03-28T12:00", "2026-04-01T00:00"),
        ("@yearly", "2026-03-28T12:00", "2027-01-01T00:00"),
        ("@annually", "2026-03-28T12:00", "2027-01-01T00:00"),
        ("@DAILY", "2026-03-28T12:00", "2026-03-29T00:00"),  # any case
    ],
)
def test_aliases(alias: str, after: str, expected: str) -> None:
    cadence = parse_cadence(cron=alias)
    assert isinstance(cadence, CronCadence)
    assert cadence.expression == alias.lower()
    assert cadence.fields == ALIASES[alias.lower()]
    assert cadence.next_after(utc(after)) == utc(expected)


def test_the_aliases_are_the_seven_of_cron() -> None:
    assert sorted(ALIASES) == sorted(
        ["@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"]
    )


@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        # From Saturday 2026-03-28 12:00 UTC.
        ("0 9 * * MON-FRI", "2026-03-28T12:00", "2026-03-30T09:00"),  # Monday
        ("0 9 * * mon-fri", "2026-03-28T12:00", "2026-03-30T09:00"),
        ("0 0 * * 7", "2026-03-28T12:00", "2026-03-29T00:00"),  # 7 is Sunday too
        ("0 0 L * *", "2026-03-28T12:00", "2026-03-31T00:00"),  # last day of March
        ("0 0 * * 5L", "2026-03-28T12:00", "2026-04-24T00:00"),  # last Friday of April
        ("0 0 * * MON#2", "2026-03-28T12:00", "2026-04-13T00:00"),  # April 6 is the first
        ("0-30/10 12 * * *", "2026-03-28T12:00", "2026-03-28T12:10"),
        ("0 0 1 JAN *", "2026-03-28T12:00", "2027-01-01T00:00"),
        ("0 0 13 * FRI", "2026-03-28T12:00", "2026-04-03T00:00"),  # 13th or Friday: Fri Apr 3
    ],
)
def test_cron_syntax(cron: str, after: str, expected: str) -> None:
    assert parse_cadence(cron=cron).next_after(utc(after)) == utc(expected)


def test_spaces_are_normalised() -> None:
    cadence = parse_cadence(cron="  30   2 * *\t* ", timezone=AMS)
    assert cadence == CronCadence("30 2 * * *", AMS)


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"cron": "30 2 * * *", "timezone": AMS}, 'cron "30 2 * * *" in Europe/Amsterdam'),
        ({"cron": "@daily"}, 'cron "@daily" in UTC'),
        ({"every": "15m", "offset": "5m"}, "every 15m (offset 5m)"),
        ({"every": "1h"}, "every 1h"),
        ({"every": 7}, "every 7s"),
        ({"every": "1h30m", "offset": 0}, "every 90m"),
    ],
)
def test_describe(fields: dict[str, str | int], text: str) -> None:
    assert parse_cadence(**fields).describe() == text  # type: ignore[arg-type]


def test_cadences_are_frozen_values() -> None:
    cadence = CronCadence("@daily", AMS)
    assert parse_cadence(cron="@daily", timezone=AMS) == cadence
    with pytest.raises(dataclasses.FrozenInstanceError):
        cadence.timezone = "UTC"  # type: ignore[misc]
    assert len({cadence, CronCadence("@daily", AMS), IntervalCadence(60)}) == 2


# --- errors -----------------------------------------------------------------------------------

ERRORS = [
    # The fields together.
    ({}, "$", "a schedule needs cron (times of day) or every (an interval)"),
    ({"cron": "@daily", "every": "1h"}, "$", "a schedule takes either cron or every, not both"),
    ({"cron": "@daily", "offset": "5m"}, "$.offset",
     "offset goes with every, not with cron (a cron names its own times)"),
    ({"every": "1h", "timezone": AMS}, "$.timezone",
     "timezone 'Europe/Amsterdam' goes with cron, not with every: an interval counts from the"
     " Unix epoch in UTC, whatever the zone (write a cron for local times)"),
    # cron.
    ({"cron": "61 * * * *"}, "$.cron", "cron '61 * * * *': minute 61 is out of range (0-59)"),
    ({"cron": "0 24 * * *"}, "$.cron", "cron '0 24 * * *': hour 24 is out of range (0-23)"),
    ({"cron": "0 0 0 * *"}, "$.cron", "cron '0 0 0 * *': day-of-month 0 is out of range (1-31)"),
    ({"cron": "0 0 * 13 *"}, "$.cron", "cron '0 0 * 13 *': month 13 is out of range (1-12)"),
    ({"cron": "0 0 * * 8"}, "$.cron", "cron '0 0 * * 8': day-of-week 8 is out of range (0-7)"),
    ({"cron": "1,2,99 * * * *"}, "$.cron",
     "cron '1,2,99 * * * *': minute 99 is out of range (0-59)"),
    ({"cron": "*/0 * * * *"}, "$.cron",
     "cron '*/0 * * * *': minute step '0' in '*/0' is not a whole number of at least 1"),
    ({"cron": "30-10 * * * *"}, "$.cron",
     "cron '30-10 * * * *': minute range 30-10 runs backwards"),
    ({"cron": "0 0 * DEC-JAN *"}, "$.cron",
     "cron '0 0 * DEC-JAN *': month range DEC-JAN runs backwards"),
    ({"cron": "1- * * * *"}, "$.cron", "cron '1- * * * *': minute '1-' lacks a number"),
    ({"cron": "a * * * *"}, "$.cron", "cron 'a * * * *': minute 'a' is not a number"),
    ({"cron": "¹ * * * *"}, "$.cron", "cron '¹ * * * *': minute '¹' is not a number"),
    ({"cron": "0 0 * Foo *"}, "$.cron",
     "cron '0 0 * Foo *': month 'Foo' is not a number or a name such as JAN"),
    ({"cron": "0 0 * * MONDAY"}, "$.cron",
     "cron '0 0 * * MONDAY': day-of-week 'MONDAY' is not a number or a name such as MON"),
    ({"cron": "0 0 * * MON#6"}, "$.cron",
     "cron '0 0 * * MON#6': day-of-week 'MON#6': the week after # is 1-5"),
    ({"cron": "0 0 30 2 *"}, "$.cron",
     "cron '0 0 30 2 *': day-of-month 30 is past the end of every month given"),
    ({"cron": "* * */20 * 1L"}, "$.cron",
     "cron '* * */20 * 1L' never fires: no day matches both its day fields"),
    ({"cron": "* * * *"}, "$.cron",
     "cron '* * * *': expected five fields (minute hour day-of-month month day-of-week), got 4"),
    ({"cron": "0 * * * * *"}, "$.cron",
     "cron '0 * * * * *': expected five fields (minute hour day-of-month month day-of-week),"
     " got 6 (a sixth field of seconds is not supported)"),
    ({"cron": ""}, "$.cron",
     "cron '': expected five fields (minute hour day-of-month month day-of-week), got 0"),
    ({"cron": "@dayly"}, "$.cron",
     "cron '@dayly' is not a cron alias (did you mean '@daily'?): the aliases are @yearly,"
     " @annually, @monthly, @weekly, @daily, @midnight, @hourly"),
    ({"cron": "@reboot"}, "$.cron",
     "cron '@reboot' is not a cron alias: the aliases are @yearly, @annually, @monthly,"
     " @weekly, @daily, @midnight, @hourly"),
    ({"cron": 5}, "$.cron", "cron must be a string such as '30 2 * * *', not integer"),
    # timezone.
    ({"cron": "@daily", "timezone": "Europe/Amsterdm"}, "$.timezone",
     "timezone 'Europe/Amsterdm' is not an IANA time zone (did you mean 'Europe/Amsterdam'?)"),
    ({"cron": "@daily", "timezone": "europe/amsterdam"}, "$.timezone",
     "timezone 'europe/amsterdam' is not an IANA time zone (did you mean 'Europe/Amsterdam'?)"),
    ({"cron": "@daily", "timezone": "Mars/Olympus_Mons"}, "$.timezone",
     "timezone 'Mars/Olympus_Mons' is not an IANA time zone"),
    ({"cron": "@daily", "timezone": "Europe"}, "$.timezone",
     "timezone 'Europe' is a region, not a time zone: name one in it, such as"
     " 'Europe/Amsterdam'"),
    ({"cron": "@daily", "timezone": "../../etc/passwd"}, "$.timezone",
     "timezone '../../etc/passwd' is not an IANA time zone"),
    ({"cron": "@daily", "timezone": ""}, "$.timezone", "timezone '' is not an IANA time zone"),
    ({"cron": "@daily", "timezone": "localtime"}, "$.timezone",
     "timezone 'localtime' is whatever this machine is set to, not an IANA time zone: name one,"
     " such as 'Europe/Amsterdam'"),
    ({"cron": "@daily", "timezone": 1}, "$.timezone",
     "timezone must be a string such as 'Europe/Amsterdam', not integer"),
    # every and offset.
    ({"every": "500ms"}, "$.every", "every 500ms: a schedule's interval is at least 1 second"),
    ({"every": 0.5}, "$.every", "every 0.5s: a schedule's interval is at least 1 second"),
    ({"every": 0}, "$.every", "every 0s: a schedule's interval is at least 1 second"),
    ({"every": "5 minutes"}, "$.every",
     "every: invalid duration '5 minutes': expected a number and a unit, like 500ms, 30s, 5m,"
     " 2h, 2d, 1h30m"),
    ({"every": "15"}, "$.every",
     "every: invalid duration '15': add a unit, e.g. '15s': expected a number and a unit, like"
     " 500ms, 30s, 5m, 2h, 2d, 1h30m"),
    ({"every": True}, "$.every",
     "every: invalid duration True: expected a number and a unit, like 500ms, 30s, 5m, 2h, 2d,"
     " 1h30m"),
    ({"every": float("inf")}, "$.every",
     "every: invalid duration inf: not a finite number of seconds"),
    ({"every": "1h", "offset": "1h"}, "$.offset",
     "offset 1h: must be less than the interval (every 1h)"),
    ({"every": "15m", "offset": 3600}, "$.offset",
     "offset 1h: must be less than the interval (every 15m)"),
    ({"every": "1h", "offset": -5}, "$.offset",
     "offset: invalid duration -5: durations cannot be negative"),
    ({"every": "1h", "offset": "-5m"}, "$.offset",
     "offset: invalid duration '-5m': expected a number and a unit, like 500ms, 30s, 5m, 2h,"
     " 2d, 1h30m"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "path", "message"), ERRORS)
def test_errors_name_the_field(fields: dict[str, object], path: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_cadence(**fields)  # type: ignore[arg-type]
    assert (caught.value.path, caught.value.message) == (path, message)
    assert "\n" not in caught.value.message


def test_error_paths_go_below_the_schedules_path() -> None:
    with pytest.raises(InputError) as caught:
        parse_cadence(cron="61 * * * *", path="$.schedules['nightly-report']")
    assert caught.value.path == "$.schedules['nightly-report'].cron"
    with pytest.raises(InputError) as caught:
        parse_cadence(path="$.schedules.nightly")
    assert caught.value.path == "$.schedules.nightly"


def test_a_cadence_built_directly_is_checked_too() -> None:
    with pytest.raises(InputError, match="minute 61 is out of range") as caught:
        CronCadence("61 * * * *")
    assert caught.value.path == "$.cron"
    with pytest.raises(InputError, match="is not an IANA time zone") as caught:
        CronCadence("@daily", "Nowhere/Special")
    assert caught.value.path == "$.timezone"
    with pytest.raises(InputError, match=r"every 0\.5s: a schedule's interval is at least"):
        IntervalCadence(0.5)
    with pytest.raises(InputError, match=r"offset 1m: must be less than the interval \(every 1m\)"):
        IntervalCadence(60, 60)
    with pytest.raises(InputError, match="durations cannot be negative"):
        IntervalCadence(60, -1)
    with pytest.raises(TypeError, match="takes seconds as numbers"):
        IntervalCadence("15m")  # type: ignore[arg-type]


# --- a property: the daily wall-clock rule holds from any moment ----------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=365 * 86400 - 1))
def test_a_daily_cron_is_within_a_day_and_at_its_time_or_after_the_gap(second: int) -> None:
    cadence = parse_cadence(cron="30 2 * * *", timezone=AMS)
    moment = utc("2026-01-01T00:00") + timedelta(seconds=second)
    tick = cadence.next_after(moment)
    assert moment < tick <= moment + timedelta(hours=25)
    wall = tick.astimezone(ZoneInfo(AMS))
    if wall.date().isoformat() == "2026-03-29":
        assert wall.strftime("%H:%M%z") == "03:00+0200"
    else:
        assert (wall.hour, wall.minute, wall.fold) == (2, 30, 0)
    assert cadence.ticks(moment, tick, 5) == [tick]
