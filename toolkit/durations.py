"""Durations as written in workflow definitions and on the command line.

A duration is a string of one or more ``<number><unit>`` parts with units in decreasing
order, without spaces: ``500ms``, ``30s``, ``5m``, ``2h``, ``2d``, ``1h30m``, ``1.5h``.
Units: ``d`` (days of 24 hours), ``h``, ``m`` (minutes), ``s``, ``ms``. A number of seconds
(``30``, ``0.5``) still parses: definition versions registered with one keep running, while
new registrations must name the unit (docs/decisions.md, "Durations name a unit").

The JSON Schema of the definition format (``$defs/duration``) uses the same
grammar as `DURATION_PATTERN`, so a string the schema accepts always parses.
"""

from __future__ import annotations

import math
import re

__all__ = ["DURATION_PATTERN", "format_duration", "parse_duration"]

_NUMBER = r"\d+(?:\.\d+)?"

DURATION_PATTERN = (
    rf"^(?=\d)(?:({_NUMBER})d)?(?:({_NUMBER})h)?(?:({_NUMBER})m)?(?:({_NUMBER})s)?"
    rf"(?:({_NUMBER})ms)?$"
)
"""Regular expression (ECMA-262 and Python compatible) of a duration string."""

_DURATION = re.compile(DURATION_PATTERN)
_UNIT_SECONDS = (86400.0, 3600.0, 60.0, 1.0, 0.001)
_EXAMPLES = "500ms, 30s, 5m, 2h, 2d, 1h30m"


#: The longest duration accepted (100 years), seconds: longer ones overflow the database's
#: timestamps and Python's timers, and are a mistake anyway.
MAX_SECONDS = 100 * 365.25 * 86400.0

def parse_duration(value: str | int | float) -> float:
    """Convert a duration to seconds.

    Args:
        value: A non-negative number of seconds, or a string such as ``500ms``, ``30s``,
            ``5m``, ``2h``, ``2d`` or ``1h30m`` (units in decreasing order, no spaces).

    Returns:
        The duration in seconds, a finite non-negative float.

    Raises:
        ValueError: If ``value`` is not a duration (wrong type, negative, not finite, a
            string without unit, unknown or misordered units ...). The message quotes the
            value and shows examples of valid durations.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(
            f"invalid duration {value!r}: expected a number and a unit, like {_EXAMPLES}"
        )
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match is None:
            hint = f": add a unit, e.g. '{value}s'" if _is_plain_number(value) else ""
            raise ValueError(
                f"invalid duration {value!r}{hint}: expected a number and a unit, like"
                f" {_EXAMPLES}"
            )
        seconds = sum(
            float(part) * unit
            for part, unit in zip(match.groups(), _UNIT_SECONDS, strict=True)
            if part is not None
        )
    else:
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: not a finite number of seconds")
    if seconds > MAX_SECONDS:
        raise ValueError(f"invalid duration {value!r}: longer than 100 years")
    if seconds < 0:
        raise ValueError(f"invalid duration {value!r}: durations cannot be negative")
    return seconds


def _is_plain_number(text: str) -> bool:
    """Tell whether ``text`` is a bare number, so the error can suggest adding a unit."""
    return re.fullmatch(r"\s*[-+]?\d+(?:\.\d+)?\s*", text) is not None


def format_duration(seconds: float) -> str:
    """``seconds`` written as a duration, e.g. ``30d``, ``90m``, ``45s``, ``0.5s``.

    The largest whole unit of ``d``, ``h`` and ``m``, else seconds; `parse_duration` reads
    it back.
    """
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


_RATE = re.compile(
    r"^\s*(?P<calls>\d+(?:\.\d+)?)\s*/\s*(?P<unit>s|sec|second|m|min|minute|h|hour)\s*$"
)
_RATE_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
               "h": 3600.0, "hour": 3600.0}  # fmt: skip


def rate_parts(text: str) -> tuple[float, float] | None:
    """A rate ``CALLS/UNIT`` as ``(calls, unit seconds)``: ``"600/min"`` → ``(600.0, 60.0)``.

    The unit is ``s``, ``min`` or ``h`` (also ``sec``, ``second``, ``m``, ``minute``,
    ``hour``). Returns None when ``text`` is not such a rate.
    """
    match = _RATE.match(text)
    if match is None:
        return None
    return float(match["calls"]), _RATE_UNITS[match["unit"]]
