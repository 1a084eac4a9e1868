"""Named SQL queries, loaded once from the ``sql/queries/*.sql`` files of the package.

Each file holds blocks that start with a ``-- name: NAME`` line (STYLE.md: SQL lives in
``.sql`` files and the store calls queries by name).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from typing import LiteralString

_NAME_LINE = re.compile(r"^--\s*name:\s*(?P<name>\w+)\s*$", re.MULTILINE)


def parse_named_blocks(text: str) -> dict[str, str]:
    """Split SQL text into named blocks.

    Args:
        text: SQL with ``-- name: NAME`` header lines.

    Returns:
        A mapping of block name to SQL text (comments kept, surrounding space stripped).

    Raises:
        ValueError: if a name appears twice.
    """
    blocks: dict[str, str] = {}
    matches = list(_NAME_LINE.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match.group("name")
        if name in blocks:
            raise ValueError(f"SQL block {name!r} is defined twice")
        blocks[name] = text[match.end() : end].strip()
    return blocks


@functools.cache
def _all_queries() -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = importlib.resources.files("toolkit.store") / "sql" / "queries"
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if entry.name.endswith(".sql"):
            for name, sql in parse_named_blocks(entry.read_text(encoding="utf-8")).items():
                if name in queries:
                    raise ValueError(f"SQL block {name!r} is defined in two files")
                queries[name] = sql
    return queries


def query(name: str) -> LiteralString:
    """Return the SQL of a named query.

    Args:
        name: the block name, e.g. ``"claim_tasks"``.

    Returns:
        The SQL text, typed ``LiteralString`` for psycopg.

    Raises:
        KeyError: if no block has that name.
    """
    return _all_queries()[name]
