"""Named SQL queries, loaded once from the ``sql/queries/*.sql`` files of the store.

Each file holds blocks that start with a ``-- name: NAME`` line (STYLE.md: SQL lives in
``.sql`` files and the store calls queries by name). A block that starts with
``-- fragment: NAME`` is a piece that several statements share, written once: a line
``-- include: NAME`` in a statement (or in a fragment) is replaced by that fragment's text
when the files are loaded (the claim's due tasks and its lease-taking tail are fragments).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from typing import LiteralString

_HEADER = re.compile(r"^--\s*(?P<kind>name|fragment):\s*(?P<name>\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^[ \t]*--\s*include:\s*(?P<name>\w+)[ \t]*$", re.MULTILINE)


def parse_named_blocks(text: str) -> dict[str, str]:
    """Split SQL text into named blocks (fragments left out, includes not expanded).

    Args:
        text: SQL with ``-- name: NAME`` header lines.

    Returns:
        A mapping of block name to SQL text (comments kept, surrounding space stripped).

    Raises:
        ValueError: if a name appears twice.
    """
    return _blocks(text)[0]


def _blocks(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """The statements and the fragments of one file, by name."""
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match.group("name")
        if name in statements or name in fragments:
            raise ValueError(f"SQL block {name!r} is defined twice")
        blocks = statements if match.group("kind") == "name" else fragments
        blocks[name] = text[match.end() : end].strip()
    return statements, fragments


def _expanded(name: str, sql: str, fragments: dict[str, str], within: tuple[str, ...] = ()) -> str:
    """``sql`` with each ``-- include: NAME`` line replaced by that fragment, expanded too.

    A fragment may include others; one that includes itself, at any depth, is refused.
    """

    def fragment(match: re.Match[str]) -> str:
        included = match.group("name")
        if included not in fragments:
            raise ValueError(f"SQL block {name!r} includes {included!r}, which no file defines")
        if included in within:
            raise ValueError(f"SQL fragment {included!r} includes itself (in {name!r})")
        return _expanded(name, fragments[included], fragments, (*within, included))

    return _INCLUDE.sub(fragment, sql)


@functools.cache
def _all_queries() -> dict[str, str]:
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    folder = importlib.resources.files("toolkit.store") / "sql" / "queries"
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if entry.name.endswith(".sql"):
            named, shared = _blocks(entry.read_text(encoding="utf-8"))
            for name in {*named, *shared} & {*statements, *fragments}:
                raise ValueError(f"SQL block {name!r} is defined in two files")
            statements.update(named)
            fragments.update(shared)
    return {name: _expanded(name, sql, fragments) for name, sql in statements.items()}


def query(name: str) -> LiteralString:
    """Return the SQL of a named query, its fragments included.

    Args:
        name: the block name, e.g. ``"claim_tasks"``.

    Returns:
        The SQL text, typed ``LiteralString`` for psycopg (it comes from the package's own
        files, never from input).

    Raises:
        KeyError: if no block has that name.
    """
    return _all_queries()[name]


def query_names() -> list[str]:
    """The names of every query, sorted (tests check each one)."""
    return sorted(_all_queries())
