"""JSON paths as printed in faults: ``$.steps.reserve.retry``, ``$.choice[0].next``.

The format matches `jsonschema.exceptions.ValidationError.json_path`: names
that look like identifiers follow a dot, anything else is quoted in brackets
(``$.steps['check-stock']``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PathPart = str | int
"""One step of a path: a mapping key or a list index."""

JsonPath = tuple[PathPart, ...]
"""A path as parts; ``()`` is the document root ``$``."""

_PLAIN = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")


def child_path(base: str, part: PathPart) -> str:
    """Return the printed path of ``part`` below the printed path ``base``."""
    if isinstance(part, int):
        return f"{base}[{part}]"
    if _PLAIN.match(part):
        return f"{base}.{part}"
    escaped = part.replace("\\", "\\\\").replace("'", "\\'")
    return f"{base}['{escaped}']"


def format_path(parts: Iterable[PathPart]) -> str:
    """Print a path given as parts: ``("steps", "a", "choice", 0)`` → ``$.steps.a.choice[0]``."""
    path = "$"
    for part in parts:
        path = child_path(path, part)
    return path
