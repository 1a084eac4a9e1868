"""How the definition checks word their messages: short reprs, close matches, JSON types.

Shared by every check (and by the engine, for `json_type`); using nothing else of the
package.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterator, Mapping
from typing import Any

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxdict = 4
_short.maxlist = 4


def short(value: Any) -> str:
    """A repr of ``value`` short enough for a one-line message."""
    return _short.repr(value)


def closest(word: str, choices: Iterator[str] | list[str], cutoff: float = 0.6) -> str | None:
    """The choice closest to ``word`` (a likely misspelling of it), or None.

    ``cutoff``: the least similarity (difflib's ratio, 0 to 1) of a choice to suggest.
    """
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None


def suggest(word: str, choices: Iterator[str] | list[str], cutoff: float = 0.6) -> str:
    """Return ``"; did you mean 'x'?"`` for the closest choice, or ``""`` (see `closest`)."""
    meant = closest(word, choices, cutoff)
    return f"; did you mean {meant!r}?" if meant else ""


def unreached_hint(unreached: list[str]) -> str:
    """The hint of a target like no step's name: the steps nothing goes to, as a question.

    ``"; did you mean 'done', which no step goes to yet?"``; with several, ``one of`` them.
    """
    names = ", ".join(map(repr, unreached))
    which = names if len(unreached) == 1 else f"one of {names}"
    return f"; did you mean {which}, which no step goes to yet?"


def json_type(value: Any) -> str:
    """The JSON type name of a Python value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__
