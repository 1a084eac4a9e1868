"""JSON values checked against a JSON Schema: task input and signal payloads.

A value gets its schema's defaults, then is validated; the most relevant fault is worded
the way JSON is written (``null``, ``"a"``). The size and shape limits of stored values
are `toolkit.payload`'s.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from referencing import Registry

from toolkit.definition.json_schema import Draft202012Validator, ValidationError, best_match
from toolkit.definition.wording import json_type
from toolkit.errors import InputError


def input_validator(schema: Mapping[str, Any] | bool) -> Draft202012Validator:
    """A validator for task input that never fetches remote references."""
    return Draft202012Validator(schema, registry=Registry())


def json_text(value: Any, limit: int = 60) -> str:
    """``value`` written as JSON (``null``, ``"a"``, ``[1, 2]``), cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def payload_fault(error: ValidationError) -> str:
    """The message of a task input's or signal payload's fault, in JSON's words.

    The people who read it wrote JSON: ``null`` not ``None``, ``"a"`` not ``'a'``. The
    common keywords are worded here; any other keeps jsonschema's message.
    """
    keyword, wanted, value = error.validator, error.validator_value, error.instance
    if keyword == "type":
        types = " or ".join(wanted) if isinstance(wanted, list) else str(wanted)
        got = "null" if value is None else f"{json_type(value)} {json_text(value)}"
        return f"expected {types}, got {got}"
    if keyword == "enum" and isinstance(wanted, list):
        return f"{json_text(value)} is not one of {', '.join(json_text(w) for w in wanted)}"
    if keyword == "const":
        return f"expected {json_text(wanted)}, got {json_text(value)}"
    if keyword == "required" and isinstance(value, dict) and isinstance(wanted, list):
        missing = [name for name in wanted if name not in value]
        if len(missing) == 1:
            return f"missing required field {json_text(missing[0])}"
        if missing:
            return f"missing required fields {', '.join(json_text(name) for name in missing)}"
    return error.message


#: Faults of one value listed at most; the rest are counted.
MAX_FAULTS = 10


def validate_payload(schema: Mapping[str, Any], value: Any, what: str) -> Any:
    """Check a JSON value against a JSON Schema (draft 2020-12) and fill in its defaults.

    Used for signal payloads (``wait: {signal, schema}``); the same rules as task input.

    Args:
        schema: The schema.
        value: The value (JSON data). Not modified.
        what: Names the value in the error, e.g. ``"payload of signal 'approved'"``.

    Returns:
        A copy of ``value`` with defaults applied.

    Raises:
        InputError: The value does not match; ``path`` is the JSON path of the most relevant
            fault, and the message names it.
    """
    return _checked(input_validator(schema), value, what)


def _checked(validator: Draft202012Validator, value: Any, what: str) -> Any:
    """``value`` with the defaults of the validator's schema applied, once it is valid.

    Raises:
        InputError: ``invalid WHAT: PATH: message``, one line per fault (at most
            :data:`MAX_FAULTS`), the most relevant first; its ``path`` is that fault's.
    """
    try:
        filled = _apply_defaults(validator.schema, copy.deepcopy(value))
        errors = list(validator.iter_errors(filled))
    except RecursionError:
        raise InputError(f"invalid {what}: $: nested too deeply to validate", path="$") from None
    if errors:
        first = best_match(errors)
        assert first is not None
        lines = [f"invalid {what}: {first.json_path}: {payload_fault(first)}"]
        for error in sorted(errors, key=lambda e: e.json_path):
            line = f"invalid {what}: {error.json_path}: {payload_fault(error)}"
            if line not in lines:
                lines.append(line)
        if len(lines) > MAX_FAULTS:
            lines[MAX_FAULTS:] = [f"invalid {what}: ... and {len(lines) - MAX_FAULTS} more"]
        raise InputError("\n".join(lines), path=first.json_path)
    return filled


def _apply_defaults(schema: Any, value: Any) -> Any:
    """Set absent properties that declare a ``default`` (recursively into objects)."""
    if not isinstance(schema, Mapping) or not isinstance(value, dict):
        return value
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return value
    for name, subschema in properties.items():
        if not isinstance(subschema, Mapping):
            continue
        if name not in value and "default" in subschema:
            value[name] = copy.deepcopy(subschema["default"])
        if name in value:
            value[name] = _apply_defaults(subschema, value[name])
    return value
