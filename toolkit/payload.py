"""Limits on the JSON values the store keeps: task inputs, handler results, signal payloads.

A value is checked before anything is written, without recursion (a value nested 10,000
levels deep is refused, not a ``RecursionError``):

- its compact JSON text (UTF-8) is at most :attr:`PayloadLimits.max_bytes` long, default
  1 MiB (:data:`DEFAULT_MAX_BYTES`);
- it nests at most :attr:`PayloadLimits.max_depth` arrays and objects, default 64;
- it holds only what PostgreSQL's ``jsonb`` stores faithfully: objects with string keys,
  arrays, strings without NUL characters (U+0000) or unpaired surrogates, finite numbers,
  booleans and null.

The limits live on the store's :class:`~toolkit.store.database.Database` (``db.payload_limits``);
``toolkit --max-payload-bytes`` / ``TOOLKIT_MAX_PAYLOAD_BYTES`` sets the size for a command.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from toolkit.errors import ConfigError, PayloadRefused

#: Default size limit of one JSON value: 1 MiB of compact JSON text (UTF-8).
DEFAULT_MAX_BYTES = 1 << 20
#: Default nesting limit: arrays and objects inside one another.
DEFAULT_MAX_DEPTH = 64
#: The highest nesting limit that can be configured: deeper values would reach Python's
#: recursion limit in JSON Schema validation and JSON encoding.
MAX_DEPTH_CEILING = 200
#: Integers longer than this many bits are refused (Python will not print ones much longer).
_MAX_INT_BITS = 13_000

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclasses.dataclass(frozen=True)
class PayloadLimits:
    """How large and how deep a stored JSON value may be.

    Attributes:
        max_bytes: most bytes of compact JSON text (UTF-8) in one value.
        max_depth: most arrays and objects nested inside one another in one value.

    Raises:
        ConfigError: a limit is not positive, or ``max_depth`` is above
            :data:`MAX_DEPTH_CEILING`.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ConfigError(f"the payload size limit must be positive, not {self.max_bytes}")
        if not 1 <= self.max_depth <= MAX_DEPTH_CEILING:
            raise ConfigError(
                f"the payload nesting limit must be between 1 and {MAX_DEPTH_CEILING}, "
                f"not {self.max_depth}"
            )


def json_path(parts: tuple[str | int, ...]) -> str:
    """The JSON path of a location, e.g. ``$.order.lines[2]['unit price']``."""
    text = "$"
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _IDENTIFIER.match(part):
            text += f".{part}"
        else:
            shown = part if len(part) <= 40 else part[:37] + "..."
            text += "[" + json.dumps(shown) + "]"
    return text


def check_payload(value: Any, limits: PayloadLimits | None = None) -> None:
    """Check that ``value`` can be stored as JSON within ``limits``.

    The size is that of its compact JSON text, in bytes. The walk counts a bound on it (every
    character of a string as an escape of 6 bytes, every number at its longest); only a value
    whose bound passes the limit is encoded to be measured exactly.

    Args:
        value: the value (as :func:`json.loads` would return it; tuples count as arrays).
        limits: the limits; default :class:`PayloadLimits` ().

    Raises:
        PayloadRefused: the value is too large, nested too deeply, or holds something JSON or
            PostgreSQL cannot store; ``path`` is the JSON path of the fault (``$`` for size).
    """
    limits = limits or PayloadLimits()
    # Depth-first without recursion: (value, path parts, depth of the value).
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(value, (), 0)]
    text_chars = 0  # at least this many bytes
    bound = 0  # at most this many bytes
    while stack:
        node, parts, depth = stack.pop()
        if isinstance(node, str):
            _check_text(node, parts, "string")
            text_chars += len(node)
            bound += 6 * len(node) + 3  # quotes, and a comma or colon after it
        elif isinstance(node, bool) or node is None:
            bound += 6
        elif isinstance(node, int):
            bits = node.bit_length()
            if bits > _MAX_INT_BITS:
                raise _refused(parts, "the integer is too large to store")
            bound += 21 if bits <= 64 else bits // 3 + 3  # digits <= bits * log10(2) + sign
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise _refused(parts, f"{node!r} is not a JSON number")
            bound += 25  # the longest repr is 24 characters
        elif isinstance(node, dict | list | tuple):
            bound += 3
            if depth + 1 > limits.max_depth:
                raise _refused(
                    parts,
                    f"the value nests deeper than {limits.max_depth} levels of arrays and "
                    "objects (the payload nesting limit)",
                    limit=limits.max_depth,
                )
            if isinstance(node, dict):
                for key, child in node.items():
                    if not isinstance(key, str):
                        raise _refused(
                            parts, f"object key {key!r} is a {type(key).__name__}, not a string"
                        )
                    _check_text(key, (*parts, key), "object key")
                    text_chars += len(key)
                    bound += 6 * len(key) + 3
                    stack.append((child, (*parts, key), depth + 1))
            else:
                stack.extend((child, (*parts, i), depth + 1) for i, child in enumerate(node))
        else:
            raise _refused(parts, f"a {type(node).__name__} is not a JSON value")
        if text_chars > limits.max_bytes:  # the text is at least this long: stop early
            raise _too_large(limits, text_chars, at_least=True)
    if bound <= limits.max_bytes:
        return
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > limits.max_bytes:
        raise _too_large(limits, size)


def _check_text(text: str, parts: tuple[str | int, ...], what: str) -> None:
    if "\x00" in text:
        raise _refused(
            parts, f"the {what} holds a NUL character (\\u0000), which PostgreSQL cannot store"
        )
    if _SURROGATE.search(text):
        raise _refused(parts, f"the {what} holds an unpaired UTF-16 surrogate, not valid Unicode")


def _refused(
    parts: tuple[str | int, ...], reason: str, *, limit: int | None = None
) -> PayloadRefused:
    path = json_path(parts)
    return PayloadRefused(f"{path}: {reason}", path=path, reason=reason, limit=limit)


def _too_large(limits: PayloadLimits, size: int, *, at_least: bool = False) -> PayloadRefused:
    reason = (
        f"the value is {'at least ' if at_least else ''}{size} bytes of JSON, over the "
        f"payload size limit of {limits.max_bytes} bytes"
    )
    return PayloadRefused(f"$: {reason}", path="$", reason=reason, limit=limits.max_bytes)


def parse_json(text: str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse JSON text, refusing nesting past ``max_depth`` before the parser recurses.

    :func:`json.loads` recurses once per level and raises ``RecursionError`` near a thousand
    levels; this refuses anything deeper than the payload nesting limit first, with the same
    message :func:`check_payload` gives, in one linear scan (skipped when the text has too
    few brackets to nest that deep).

    Args:
        text: JSON text.
        max_depth: most arrays and objects nested inside one another.

    Returns:
        The value.

    Raises:
        PayloadRefused: the text nests deeper than ``max_depth``.
        json.JSONDecodeError: the text is not JSON.
    """
    if text.count("[") + text.count("{") > max_depth:
        depth = 0
        in_string = escaped = False
        for char in text:
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
            elif char == '"':
                in_string = True
            elif char in "[{":
                depth += 1
                if depth > max_depth:
                    raise _refused(
                        (),
                        f"the value nests deeper than {max_depth} levels of arrays and "
                        "objects (the payload nesting limit)",
                        limit=max_depth,
                    )
            elif char in "]}":
                depth -= 1
    return json.loads(text)
