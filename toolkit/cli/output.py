"""Values as text: whole as indented JSON (``--json``), or cut to one line for a table."""

from __future__ import annotations

import json
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
