"""psycopg's placeholders turned into PostgreSQL's own, once per statement text (issue 22).

psycopg takes ``%(name)s`` and ``%s`` placeholders and converts a statement into
PostgreSQL's ``$1, $2 …`` on every execution. It caches that conversion only for statements
of at most 4 KiB; the claim is 10 KiB and the fenced write 25 KiB (their comments included),
so every claim and every group commit parsed its whole text again: about 5 % of a busy
worker's CPU. The store's connections therefore use psycopg's raw-query cursor, which sends
a statement with PostgreSQL's placeholders as it is (`NotifyingCursor`), and a statement
written with psycopg's placeholders is converted here, once per distinct text.

The rules are psycopg's: ``%(name)s`` binds the mapping's ``name`` (a name used twice is one
parameter), ``%s`` the next item of a sequence, ``%%`` is a literal ``%``; the two kinds do
not mix. Only ``s`` is accepted as a format (psycopg's ``%t`` / ``%b`` ask for a text or
binary format, which the store never does). A statement run without parameters is sent as it
is, ``%`` included, as psycopg does.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

#: psycopg's placeholder syntax: ``%`` then a name in parentheses and a format, or one more
#: character (``%%``, ``%s``, or a mistake). ``.`` stops at a line end, as psycopg's does.
_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\)(.)|(.))")
#: How many distinct statement texts keep their conversion (the store has about 200).
CACHED_STATEMENTS = 1024


@dataclasses.dataclass(frozen=True)
class Converted:
    """A statement with PostgreSQL's placeholders.

    ``text``: the statement, ``$1 …`` in place of psycopg's placeholders and ``%`` in place
    of ``%%``; ``names``: the parameter of each ``$n`` in order, for named placeholders, or
    None for positional ones; ``count``: how many parameters it takes.
    """

    text: str
    names: tuple[str, ...] | None
    count: int


@functools.lru_cache(maxsize=CACHED_STATEMENTS)
def convert(query: str) -> Converted:
    """``query`` with PostgreSQL's placeholders in place of psycopg's (cached per text).

    Raises:
        psycopg.ProgrammingError: a placeholder psycopg would refuse (``%`` followed by
            anything but ``s``, ``(name)s`` or ``%``), an unclosed ``%(``, or named and
            positional placeholders mixed.
    """
    chunks: list[str] = []
    names: dict[str, int] = {}
    positional = 0
    start = 0
    for match in _PLACEHOLDER.finditer(query):
        chunks.append(query[start : match.start()])
        start = match.end()
        name, named_format, other = match.groups()
        if other == "%":
            chunks.append("%")
            continue
        if (named_format or other) != "s":
            raise psycopg.ProgrammingError(
                f"only '%s', '%(name)s' and '%%' may be used in a statement's text, got "
                f"{match.group(0)!r} at character {match.start()}"
            )
        if name is not None:
            if positional:
                raise psycopg.ProgrammingError(
                    "positional and named placeholders cannot be mixed"
                )
            number = names.setdefault(name, len(names) + 1)
        else:
            if names:
                raise psycopg.ProgrammingError(
                    "positional and named placeholders cannot be mixed"
                )
            positional += 1
            number = positional
        chunks.append(f"${number}")
    chunks.append(query[start:])
    text = "".join(chunks)
    if positional:
        return Converted(text, None, positional)
    return Converted(text, tuple(names), len(names))


def bind(query: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple[str, list[Any]]:
    """The statement to send for ``query`` and ``params``, and its parameters in order.

    Args:
        query: a statement with psycopg's placeholders.
        params: a mapping for named placeholders, a sequence for positional ones (either,
            when empty, for a statement with none).

    Returns:
        (text with ``$n`` placeholders, the parameter of each ``$n``).

    Raises:
        psycopg.ProgrammingError: a mapping lacks a name the statement uses, a sequence has
            the wrong length, or the placeholders are malformed (see `convert`).
        TypeError: a sequence for named placeholders, or a mapping for positional ones.
    """
    converted = convert(query)
    if isinstance(params, Mapping):
        if converted.names is None:
            raise TypeError("positional placeholders (%s) require a sequence of parameters")
        try:
            return converted.text, [params[name] for name in converted.names]
        except KeyError as exc:
            raise psycopg.ProgrammingError(f"query parameter missing: {exc.args[0]}") from None
    if isinstance(params, str | bytes):
        raise TypeError(f"query parameters should be a sequence or a mapping, got {params!r}")
    if converted.names:
        raise TypeError("named placeholders require a mapping of parameters")
    if len(params) != converted.count:
        raise psycopg.ProgrammingError(
            f"the query has {converted.count} placeholders but {len(params)} parameters were "
            "passed"
        )
    return converted.text, list(params)
