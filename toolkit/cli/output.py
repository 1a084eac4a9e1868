"""Values as text: whole as indented JSON (``--json``), or cut to one line for a table."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

import click


def echo_json(value: Any) -> None:
    """Print ``value`` as indented JSON (what ``--json`` prints); dates and decimals as text."""
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def json_line(value: Any) -> str:
    """``value`` as one line of JSON (as ``--input`` takes it); dates and decimals as text."""
    return json.dumps(value, default=str, ensure_ascii=False)


def clip(value: Any, limit: int) -> str:
    """``value`` as one line of JSON, cut to ``limit`` characters with an ellipsis.

    The ``--json`` output has it whole.
    """
    text = json_line(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def aligned(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """Rows of text cells as lines, each column as wide as its widest cell, two spaces apart.

    Args:
        rows: the header first, then the rows; every row as long as the header.
        right: the indexes of the columns aligned right (counts); the others align left.

    Returns:
        One line per row, trailing spaces removed.
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
