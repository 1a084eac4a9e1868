"""When a recurring schedule ticks: cron and interval cadences, as pure arithmetic.

A schedule starts one task per tick. This module says when the ticks are; it keeps no
state, reads no clock and touches no database: every answer is a function of the cadence
and the moments passed in. Moments in are aware datetimes (any zone); moments out are
aware datetimes in UTC.

Two kinds, both frozen dataclasses with the same methods (`Cadence` is their union):

- `CronCadence`: a five-field cron expression (``minute hour day-of-month month
  day-of-week``) read on the wall clock of an IANA time zone, or one of the aliases
  ``@hourly``, ``@daily``, ``@midnight``, ``@weekly``, ``@monthly``, ``@yearly`` and
  ``@annually``. The syntax is that of Debian's cron as the `cronsim` library reads it:
  ``*``, numbers, ranges ``1-5``, lists ``1,15``, steps ``*/15`` and ``0-30/10``, month
  and day names (``JAN``, ``MON-FRI``, any case), 0 or 7 for Sunday, and `cronsim`'s
  extensions ``L`` and ``LW`` (last day, last weekday of the month), ``5L`` (last Friday)
  and ``MON#2`` (second Monday). When both day fields are restricted (neither starts with
  ``*``) a day matching either fires, as in cron. There is no seconds field.
- `IntervalCadence`: every N seconds (at least 1), counted from the Unix epoch in UTC plus
  an offset: the ticks are ``1970-01-01T00:00:00Z + offset + k * every`` for every whole
  ``k``. The time zone plays no part, so daylight saving time never moves an interval's
  ticks (``every: 1d`` ticks at 00:00 UTC; write a cron for local times).

`parse_cadence` builds either from a schedule's fields as written in YAML and refuses bad
ones with an `InputError` naming the field.

Daylight saving time, for a cron (as `cronsim` does it, after Debian's cron):

- **A cron whose minute and hour fields are both specific** (neither starts with ``*``:
  ``30 2 * * *``, ``0,30 2 * * *``, ``0 1-5 * * *``, ``@daily``) is read on the wall clock,
  and each wall-clock time it names fires once a day:

  - *Spring forward.* A time that does not exist that day (Amsterdam's 02:30 on
    2026-03-29, when 02:00 CET jumps to 03:00 CEST) fires at the first instant after the
    gap, 03:00 local, once: if the expression names several times in the gap, or also the
    time just after it, they fire together as one tick.
  - *Fall back.* A time that happens twice (Amsterdam's 02:30 on 2026-10-25, when 03:00
    CEST goes back to 02:00 CET) fires at its first occurrence (``fold=0``, the summer
    time) only.

- **A cron whose minute or hour field starts with ``*``** (``0 * * * *``, ``@hourly``,
  ``*/15 * * * *``, ``0 */2 * * *``) follows real time: it fires at every instant whose
  local wall clock matches. An hourly cron fires once an hour, 23 times on a spring-forward
  day and 25 on a fall-back day (the repeated hour's ``:00`` fires in both of its
  occurrences, which are an hour apart); the hour that does not exist is the only one
  lost. Likewise ``*/15 * * * *`` fires every 15 real minutes straight through both
  transitions: the repeated hour's quarter-hours fire again, in its second occurrence, and
  none is doubled within an instant.

Ticks are instants, strictly increasing: no two ticks of one cadence are the same instant,
and `CronCadence.next_after` never returns a moment at or before the one passed in, even
from inside a repeated hour (where `cronsim` alone would return the hour's first
occurrence, already past).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import islice, takewhile
from typing import TypeAlias
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

from toolkit.definition.paths import child_path
from toolkit.definition.wording import closest, json_type
from toolkit.durations import format_duration, parse_duration
from toolkit.errors import InputError

__all__ = [
    "ALIASES",
    "MIN_INTERVAL_SECONDS",
    "Cadence",
    "CronCadence",
    "IntervalCadence",
    "parse_cadence",
]

#: The cron aliases and the five fields each stands for.
ALIASES: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: The shortest interval of an `IntervalCadence`, seconds.
MIN_INTERVAL_SECONDS = 1.0

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)
_FIELD_LIST = "minute hour day-of-month month day-of-week"
_NAMES = {
    "month": "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(),
    "day-of-week": "SUN MON TUE WED THU FRI SAT".split(),
}
_NAME_EXAMPLES = {"month": "JAN", "day-of-week": "MON"}
#: Where a new expression is tried once, to refuse one that never fires (`cronsim` looks 50
#: years ahead; every pattern of days recurs well within that).
_PROBE = datetime(2000, 1, 1, tzinfo=UTC)
#: Names `zoneinfo` may load that are not zones a definition can rely on elsewhere.
_NOT_PORTABLE = frozenset({"localtime"})


class _Ticking(ABC):
    """What both cadences do, given the ticks after a moment (`_after`)."""

    @abstractmethod
    def _after(self, moment: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``moment`` (aware), ascending, as aware UTC datetimes."""

    @abstractmethod
    def describe(self) -> str:
        """The cadence in words, for people."""

    def next_after(self, moment: datetime) -> datetime:
        """Return the first tick strictly after ``moment``.

        Args:
            moment: An aware datetime, in any zone; a tick exactly at ``moment`` is not
                returned (the next one is), so ``next_after(tick)`` walks the ticks.

        Returns:
            The tick, an aware datetime in UTC.

        Raises:
            ValueError: ``moment`` is naive; or a cron has no tick in the 50 years after it
                (`cronsim`'s horizon; an expression `parse_cadence` accepts fires at least
                every few decades, so only a moment near the year 9999 meets this).
        """
        tick = next(self._after(_aware(moment, "moment")), None)
        if tick is None:
            raise ValueError(f"{self.describe()} has no tick in the 50 years after {moment}")
        return tick

    def ticks(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """Return the ticks in ``(start, end]``, ascending, at most ``limit`` of them.

        Args:
            start: An aware datetime; a tick exactly at ``start`` is left out.
            end: An aware datetime; a tick exactly at ``end`` is included. An ``end`` at or
                before ``start`` gives no ticks.
            limit: The most ticks returned (0 or more). Past the limit the later ticks are
                left out, not dropped for good: the earliest ``limit`` are returned, and
                ``ticks(result[-1], end, limit)`` goes on from there. A caller that sees
                ``len(result) == limit`` cannot tell whether more remain without asking.

        Returns:
            Aware UTC datetimes, strictly increasing.

        Raises:
            ValueError: ``start`` or ``end`` is naive, or ``limit`` is negative.
        """
        start, end = _aware(start, "start"), _aware(end, "end")
        if limit < 0:
            raise ValueError(f"limit must be 0 or more, not {limit}")
        if limit == 0 or end <= start:
            return []
        return list(islice(takewhile(lambda tick: tick <= end, self._after(start)), limit))


@dataclass(frozen=True)
class CronCadence(_Ticking):
    """Ticks at the times a cron expression names, on the wall clock of a time zone.

    See the module's docstring for the syntax and for what daylight saving time does.

    Attributes:
        expression: Five fields (``"30 2 * * *"``) or an alias (``"@daily"``).
        timezone: The IANA time zone whose wall clock the expression reads, e.g.
            ``"Europe/Amsterdam"``; ``"UTC"`` by default.

    Raises:
        InputError: At construction, for an expression or time zone `parse_cadence` would
            refuse (path ``$.cron`` or ``$.timezone``).
    """

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        _check_cron(self.expression, "$.cron")
        _zone(self.timezone, "$.timezone")

    @property
    def fields(self) -> str:
        """The five fields of the expression, an alias expanded (``@daily``: ``0 0 * * *``)."""
        return _expand(self.expression)

    @property
    def zone(self) -> ZoneInfo:
        """The time zone, loaded."""
        return ZoneInfo(self.timezone)

    def describe(self) -> str:
        """The cadence in words: ``cron "30 2 * * *" in Europe/Amsterdam``."""
        return f'cron "{self.expression}" in {self.timezone}'

    def _after(self, moment: datetime) -> Iterator[datetime]:
        # cronsim walks a specific-time expression on the naive wall clock, which forgets
        # whether `moment` is in the first or the second pass of a repeated hour: from the
        # second pass it would offer the first, already past. Only later instants count.
        last = moment.astimezone(UTC)
        for found in CronSim(self.fields, moment.astimezone(self.zone)):
            tick = found.astimezone(UTC)
            if tick > last:
                last = tick
                yield tick


@dataclass(frozen=True)
class IntervalCadence(_Ticking):
    """Ticks every ``every_seconds``, at ``epoch + offset_seconds + k * every_seconds`` (UTC).

    The Unix epoch anchors the ticks, so they do not depend on when the schedule was made,
    and no time zone moves them. Both values are used to the microsecond.

    Attributes:
        every_seconds: The interval, seconds (at least `MIN_INTERVAL_SECONDS`).
        offset_seconds: Where in each interval the tick falls, seconds, 0 (the default) or
            more and less than ``every_seconds``: ``every 1h`` with ``offset 5m`` ticks at
            five past each hour, UTC.

    Raises:
        InputError: At construction, for values `parse_cadence` would refuse (path
            ``$.every`` or ``$.offset``).
    """

    every_seconds: float
    offset_seconds: float = 0.0

    def __post_init__(self) -> None:
        for value in (self.every_seconds, self.offset_seconds):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"an IntervalCadence takes seconds as numbers, not {value!r}")
        every = _duration(self.every_seconds, "every", "$.every")
        offset = _duration(self.offset_seconds, "offset", "$.offset")
        _check_interval(every, offset, _written(self.every_seconds), _written(offset), "$")

    def describe(self) -> str:
        """The cadence in words: ``every 15m (offset 5m)``, ``every 7s``."""
        text = f"every {format_duration(self.every_seconds)}"
        if self.offset_seconds:
            text += f" (offset {format_duration(self.offset_seconds)})"
        return text

    def _after(self, moment: datetime) -> Iterator[datetime]:
        every = round(self.every_seconds * 1_000_000)
        offset = round(self.offset_seconds * 1_000_000)
        elapsed = (moment - _EPOCH) // _MICROSECOND
        k = (elapsed - offset) // every + 1
        while True:
            yield _EPOCH + timedelta(microseconds=offset + k * every)
            k += 1


Cadence: TypeAlias = CronCadence | IntervalCadence
"""A schedule's cadence: either kind; both have ``next_after``, ``ticks`` and ``describe``."""


def parse_cadence(
    *,
    cron: str | None = None,
    every: str | float | None = None,
    offset: str | float | None = None,
    timezone: str = "UTC",
    path: str = "$",
) -> Cadence:
    """Build a cadence from a schedule's fields as written.

    Args:
        cron: A five-field cron expression or an alias (``@daily`` ...); see the module's
            docstring. Spaces between fields may be any run of whitespace.
        every: An interval: a duration string (``15m``, ``1h30m``) or a number of seconds,
            as `toolkit.durations.parse_duration` reads it; at least 1 second.
        offset: Where in each interval the tick falls, a duration, 0 or more and less than
            ``every``; only with ``every``. Default 0.
        timezone: The IANA time zone a cron reads (``Europe/Amsterdam``); only ``"UTC"``,
            the default, goes with ``every``, whose ticks no zone moves.
        path: The JSON path of the schedule, for the errors' ``path``: a fault in ``cron``
            has ``{path}.cron``, and so on.

    Returns:
        A `CronCadence` (its expression with single spaces, an alias in lower case) or an
        `IntervalCadence`.

    Raises:
        InputError: One line naming the field and what is wrong with it, e.g.
            ``cron '61 * * * *': minute 61 is out of range (0-59)`` (path ``$.cron``),
            ``timezone 'Europe/Amsterdm' is not an IANA time zone (did you mean
            'Europe/Amsterdam'?)``, ``every 500ms: a schedule's interval is at least 1
            second``; and, with ``path`` itself, a schedule with both or neither of ``cron``
            and ``every``.
    """
    if cron is not None and every is not None:
        raise InputError("a schedule takes either cron or every, not both", path=path)
    if cron is None and every is None:
        raise InputError("a schedule needs cron (times of day) or every (an interval)", path=path)
    if cron is not None:
        if offset is not None:
            raise InputError(
                "offset goes with every, not with cron (a cron names its own times)",
                path=child_path(path, "offset"),
            )
        text = _check_cron(cron, child_path(path, "cron"))
        _zone(timezone, child_path(path, "timezone"))
        return CronCadence(text, timezone)
    if timezone != "UTC":
        raise InputError(
            f"timezone {timezone!r} goes with cron, not with every: an interval counts from"
            " the Unix epoch in UTC, whatever the zone (write a cron for local times)",
            path=child_path(path, "timezone"),
        )
    assert every is not None
    every_seconds = _duration(every, "every", child_path(path, "every"))
    offset = 0 if offset is None else offset
    offset_seconds = _duration(offset, "offset", child_path(path, "offset"))
    _check_interval(every_seconds, offset_seconds, _written(every), _written(offset), path)
    return IntervalCadence(every_seconds, offset_seconds)


# --- checks -------------------------------------------------------------------------------


def _aware(moment: datetime, name: str) -> datetime:
    """``moment`` itself, if it is an aware datetime; else ValueError naming it."""
    if moment.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime (with a time zone), not {moment}")
    return moment


def _expand(expression: str) -> str:
    """The five fields an expression stands for: an alias expanded, spaces made single."""
    text = " ".join(expression.split())
    return ALIASES.get(text.lower(), text)


def _check_cron(expression: object, path: str) -> str:
    """Return ``expression`` with single spaces (an alias in lower case), or raise InputError.

    `cronsim` decides what is valid; when it refuses, `_diagnose` says why in words.
    """
    if not isinstance(expression, str):
        raise InputError(
            f"cron must be a string such as '30 2 * * *', not {json_type(expression)}", path=path
        )
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() in ALIASES:
            return text.lower()
        meant = closest(text.lower(), list(ALIASES))
        hint = f" (did you mean {meant!r}?)" if meant else ""
        raise InputError(
            f"cron {expression!r} is not a cron alias{hint}: the aliases are"
            f" {', '.join(ALIASES)}",
            path=path,
        )
    count = len(text.split())
    if count != 5:
        seconds = " (a sixth field of seconds is not supported)" if count == 6 else ""
        raise InputError(
            f"cron {expression!r}: expected five fields ({_FIELD_LIST}), got {count}{seconds}",
            path=path,
        )
    try:
        found = next(CronSim(text, _PROBE), None)
    except CronSimError as exc:
        raise InputError(f"cron {expression!r}: {_diagnose(text, str(exc))}", path=path) from None
    if found is None:
        raise InputError(
            f"cron {expression!r} never fires: no day matches both its day fields", path=path
        )
    return text


def _diagnose(text: str, message: str) -> str:
    """Word `cronsim`'s ``Bad minute`` (say) for the term of that field that is wrong."""
    names = [name for name, _, _ in _FIELDS]
    field = message.removeprefix("Bad ")
    if field not in names:
        return message
    index = names.index(field)
    token = text.split()[index]
    for term in token.split(","):
        problem = _term_problem(term, index)
        if problem:
            return problem
    if field == "day-of-month":
        return f"day-of-month {token} is past the end of every month given"
    return f"{field} {token!r} is not valid"


def _term_problem(term: str, index: int) -> str | None:
    """What is wrong with one comma-separated term of field ``index``, if it can be told."""
    name = _FIELDS[index][0]
    base, slash, step = term.partition("/")
    if slash and not (_digits(step) and int(step) >= 1):
        return f"{name} step {step!r} in {term!r} is not a whole number of at least 1"
    if name == "day-of-month" and base.upper() in ("L", "LW"):
        return None
    if name == "day-of-week":
        if "#" in base:
            base, _, nth = base.partition("#")
            if not (_digits(nth) and 1 <= int(nth) <= 5):
                return f"day-of-week {term!r}: the week after # is 1-5"
        elif base.upper().endswith("L"):
            base = base[:-1]
    if base == "*":
        return None
    start, dash, end = base.partition("-")
    for value in (start, end) if dash else (start,):
        if not value:
            return f"{name} {term!r} lacks a number"
        problem = _value_problem(value, index)
        if problem:
            return problem
    if dash and _value(start, index) > _value(end, index):
        return f"{name} range {base} runs backwards"
    return None


def _value_problem(value: str, index: int) -> str | None:
    """What is wrong with one number or name of field ``index``, if anything."""
    name, low, high = _FIELDS[index]
    if value.upper() in _NAMES.get(name, ()):
        return None
    if not _digits(value):
        named = f" or a name such as {_NAME_EXAMPLES[name]}" if name in _NAMES else ""
        return f"{name} {value!r} is not a number{named}"
    if not low <= int(value) <= high:
        return f"{name} {int(value)} is out of range ({low}-{high})"
    return None


def _value(value: str, index: int) -> int:
    """The number a checked value of field ``index`` stands for (``JAN`` is 1, ``SUN`` 0)."""
    names = _NAMES.get(_FIELDS[index][0], [])
    if value.upper() in names:
        return names.index(value.upper()) + (1 if names is _NAMES["month"] else 0)
    return int(value)


def _digits(text: str) -> bool:
    """Whether ``text`` is ASCII digits only (cron's numbers; not ``¹`` or ``٣``)."""
    return bool(text) and all("0" <= ch <= "9" for ch in text)


def _zone(name: object, path: str) -> ZoneInfo:
    """The IANA time zone ``name``, or InputError suggesting the closest one."""
    if not isinstance(name, str):
        raise InputError(
            f"timezone must be a string such as 'Europe/Amsterdam', not {json_type(name)}",
            path=path,
        )
    if name in _zone_names():
        return ZoneInfo(name)
    if name in _NOT_PORTABLE:
        raise InputError(
            f"timezone {name!r} is whatever this machine is set to, not an IANA time zone:"
            " name one, such as 'Europe/Amsterdam'",
            path=path,
        )
    inside = sorted(zone for zone in _zone_names() if zone.startswith(f"{name}/"))
    if inside:
        raise InputError(
            f"timezone {name!r} is a region, not a time zone: name one in it, such as"
            f" {inside[0]!r}",
            path=path,
        )
    folded = {zone.lower(): zone for zone in _zone_names()}
    meant = folded.get(name.lower()) or closest(name, sorted(_zone_names()))
    hint = f" (did you mean {meant!r}?)" if meant else ""
    raise InputError(f"timezone {name!r} is not an IANA time zone{hint}", path=path)


@cache
def _zone_names() -> frozenset[str]:
    """The IANA zones `zoneinfo` can load here (the `tzdata` package's at least)."""
    return frozenset(available_timezones() - _NOT_PORTABLE)


def _duration(value: str | float, field: str, path: str) -> float:
    """``value`` as seconds, through `parse_duration`, or InputError naming ``field``.

    `parse_duration` checks the type itself, so a value of any type read from YAML is safe.
    """
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise InputError(f"{field}: {exc}", path=path) from None


def _check_interval(
    every: float, offset: float, every_text: str, offset_text: str, path: str
) -> None:
    """Refuse an interval under a second, or an offset not less than the interval."""
    if every < MIN_INTERVAL_SECONDS:
        raise InputError(
            f"every {every_text}: a schedule's interval is at least 1 second",
            path=child_path(path, "every"),
        )
    if offset >= every:
        raise InputError(
            f"offset {offset_text}: must be less than the interval (every {every_text})",
            path=child_path(path, "offset"),
        )


def _written(value: str | float) -> str:
    """A duration as the message shows it: a string as written, a number as a duration."""
    if isinstance(value, str):
        return value
    return format_duration(value) if math.isfinite(value) else repr(value)
