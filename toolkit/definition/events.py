"""Checks of what a definition says about events (docs/events.md): triggers and matches.

A correlated wait's ``match`` values are computed when the task starts (it subscribes then,
so that no matching event emitted since is missed): they read the task's ``input`` and
``context``, never a step's output. A trigger's expressions read the event (``event``: its
payload) and ``context``; its ``key`` must read the event, or every event would name one
task.
"""

from __future__ import annotations

from typing import Any

from toolkit.definition.expressions import scope_reads
from toolkit.definition.input_schema import input_schema_problems
from toolkit.definition.paths import JsonPath
from toolkit.definition.references import (
    _single_expression_problems,
    expression_strings,
    reads_only,
    template_problems,
)
from toolkit.definition.wording import suggest
from toolkit.definition.yaml_source import Problem

#: What a match value may read, and what a trigger's expressions may read.
MATCH_NAMES = ("input", "context")
TRIGGER_NAMES = ("event", "context")
_LITERALS = ("null", "true", "false")


def match_problems(path: JsonPath, match: dict[str, Any]) -> list[Problem]:
    """Problems of an event wait's ``match`` at ``path``: syntax, and what it reads."""
    why = "a match is computed when the task starts, so it reads only input and context"
    return reads_only(path, match, MATCH_NAMES, why)


def event_schema_problems(events: Any) -> list[Problem]:
    """Problems of the payload schemas a definition declares (``events:``)."""
    if not isinstance(events, dict):
        return []
    return [
        problem
        for name, schema in events.items()
        for problem in input_schema_problems(schema, ("events", name), "event schema")
    ]


def cancel_on_problems(cancel_on: Any) -> list[Problem]:
    """Problems of the definition's ``cancel_on``: its matches, as a wait's."""
    if not isinstance(cancel_on, list):
        return []
    return [
        problem
        for i, entry in enumerate(cancel_on)
        if isinstance(entry, dict) and isinstance(entry.get("match"), dict)
        for problem in match_problems(("cancel_on", i, "match"), entry["match"])
    ]


def trigger_problems(triggers: Any, declared: Any = None) -> list[Problem]:
    """Problems of the definition's ``triggers``: syntax, and what their expressions read.

    Args:
        triggers: the definition's ``triggers`` (raw).
        declared: its ``events`` (raw): a trigger of an event whose schema there lists
            ``properties`` may read only those fields of the event.
    """
    if not isinstance(triggers, list):
        return []
    schemas = declared if isinstance(declared, dict) else {}
    problems: list[Problem] = []
    for i, trigger in enumerate(triggers):
        if not isinstance(trigger, dict):
            continue
        path: JsonPath = ("triggers", i)
        for field in ("when", "key"):
            if isinstance(trigger.get(field), str):
                problems += _single_expression_problems((*path, field), trigger[field])
        if "input" in trigger:
            problems += template_problems((*path, "input"), trigger["input"])
        if problems:
            continue
        schema = schemas.get(trigger.get("event"))
        fields = schema.get("properties") if isinstance(schema, dict) else None
        for field in ("when", "input", "key"):
            if field not in trigger:
                continue
            reads = set()
            for where, text in expression_strings(trigger[field], (*path, field)):
                for expression, name, read in scope_reads(text):
                    reads.add(name)
                    if name == "event" and isinstance(fields, dict) and read is not None and (
                        read not in fields
                    ):
                        problems.append(Problem(where, (
                            f"expression {expression!r} reads field {read!r} of event "
                            f"{trigger['event']!r}, which its schema in events: does not "
                            f"declare{suggest(read, list(fields))}"
                        )))  # fmt: skip
                    if name not in (*TRIGGER_NAMES, *_LITERALS):
                        problems.append(Problem(where, (
                            f"expression {expression!r} reads {name!r}: a trigger's "
                            "expressions read the event (its payload) and context"
                        )))  # fmt: skip
            if field == "key" and "event" not in reads:
                problems.append(Problem((*path, "key"), (
                    f"key {trigger['key']!r} reads no field of the event: every event would "
                    "name the same task; read the field that identifies it, e.g. "
                    "${ event.order_id }"
                )))  # fmt: skip
    return problems

