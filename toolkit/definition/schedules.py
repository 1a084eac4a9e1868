"""Schedules a definition declares (``schedules:``): their checks and their model.

A declared schedule (docs/schedules.md, "Declared in YAML") is owned by its definition: the
store makes, changes and removes it when the newest version of the definition is deployed.
Its fields are those of a schedule made at run time, checked when the definition loads:
the cadence (:func:`~toolkit.definition.cadence.parse_cadence`), the policies, and the
input, which may read ``context.scheduled_at`` and ``context.schedule`` only and must pass
the definition's own input schema for a sample tick.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Mapping
from typing import Any, Literal

from toolkit.definition.cadence import Cadence, parse_cadence
from toolkit.definition.expressions import compile_template, scope_reads
from toolkit.definition.paths import JsonPath
from toolkit.definition.payloads import validate_payload
from toolkit.definition.references import expression_strings, template_problems
from toolkit.definition.yaml_source import Problem
from toolkit.durations import parse_duration
from toolkit.errors import ExpressionError, InputError

Overlap = Literal["skip", "buffer_one", "buffer_all", "cancel_other", "allow_all"]
Catchup = Literal["none", "latest", "all"]
#: The overlap policies: what a tick does while a run of its schedule is live.
OVERLAPS: tuple[Overlap, ...] = ("skip", "buffer_one", "buffer_all", "cancel_other", "allow_all")
#: The catch-up policies: what ticks missed while no worker ran do.
CATCHUPS: tuple[Catchup, ...] = ("none", "latest", "all")
#: A sample tick: what a declared schedule's input is checked with when it loads.
SAMPLE_TICK = "2000-01-01T00:00:00+00:00"
_CATCHUP = re.compile(r"(none|latest)|all(?: within)? +(\S+)")
_CONTEXT = frozenset({"scheduled_at", "schedule"})


@dataclasses.dataclass(frozen=True)
class ScheduleDeclaration:
    """A schedule as a definition's YAML declares it.

    Attributes:
        name: its name, unique across the store.
        cadence: when it ticks.
        input: the task input, a JSON template over ``context`` (as written).
        tenant: the tenant of its tasks.
        tags: tags of its tasks (with the definition's own).
        overlap: the overlap policy.
        catchup: the catch-up policy; ``catchup_window`` its window in seconds (``all``).
        catchup_window: see ``catchup``.
        pause_after_failures: pause after this many consecutive failed runs (None: never).
    """

    name: str
    cadence: Cadence
    input: Any
    tenant: str
    tags: Mapping[str, str]
    overlap: Overlap
    catchup: Catchup
    catchup_window: float | None
    pause_after_failures: int | None


def parse_catchup(text: str) -> tuple[Catchup, float | None]:
    """Read a catch-up policy as written: ``none``, ``latest``, ``all within 6h`` (or ``all 6h``).

    Returns:
        The policy and, for ``all``, its window in seconds (above 0).

    Raises:
        ValueError: it is none of those, or the window is not a duration above 0.
    """
    found = _CATCHUP.fullmatch(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"catchup {text!r}: none, latest, or all within WINDOW (all within 6h)")
    if found.group(1):
        return found.group(1), None  # type: ignore[return-value]
    window = parse_duration(found.group(2))
    if window <= 0:
        raise ValueError("the catch-up window must be longer than 0")
    return "all", window


def schedule_problems(doc: Mapping[str, Any], input_schema_ok: bool) -> list[Problem]:
    """Problems of the document's ``schedules`` the schema cannot see.

    A cadence that does not parse, a catch-up window that is not a duration, two schedules
    of one name, an input expression that reads anything but ``context.scheduled_at`` and
    ``context.schedule``, and (when the input schema itself is sound: ``input_schema_ok``)
    an input the definition's input schema refuses for a sample tick.
    """
    declared = doc.get("schedules")
    if not isinstance(declared, list):
        return []
    problems: list[Problem] = []
    seen: set[str] = set()
    for index, raw in enumerate(declared):
        if not isinstance(raw, dict):
            continue
        path: JsonPath = ("schedules", index)
        name = raw.get("name")
        if isinstance(name, str):
            if name in seen:
                problems.append(Problem((*path, "name"), f"two schedules are named {name!r}"))
            seen.add(name)
        problems += _cadence_problems(path, raw)
        if isinstance(raw.get("catchup"), str):
            try:
                parse_catchup(raw["catchup"])
            except ValueError as exc:
                problems.append(Problem((*path, "catchup"), str(exc)))
        if "input" in raw:
            problems += _input_problems(path, raw, doc, input_schema_ok)
    return problems


def _cadence_problems(path: JsonPath, raw: Mapping[str, Any]) -> list[Problem]:
    fields = {key: raw[key] for key in ("cron", "every", "offset", "timezone") if key in raw}
    try:
        parse_cadence(**fields)
    except InputError as exc:
        field = (exc.path or "$").removeprefix("$").removeprefix(".")
        return [Problem((*path, field) if field else path, exc.message)]
    except TypeError:  # a field of the wrong type: the schema reports it
        pass
    return []


def _input_problems(
    path: JsonPath, raw: Mapping[str, Any], doc: Mapping[str, Any], input_schema_ok: bool
) -> list[Problem]:
    where: JsonPath = (*path, "input")
    template = raw["input"]
    problems = template_problems(where, template)
    if problems:
        return problems
    for at, text in expression_strings(template, where):
        for expression, name, field in scope_reads(text):
            if name in ("null", "true", "false") or (name == "context" and field in _CONTEXT):
                continue
            problems.append(Problem(at, (
                f"expression {expression!r} reads {name}{'.' + field if field else ''}: a "
                "schedule's input is made at each tick, before its task runs, and reads "
                "context.scheduled_at and context.schedule only"
            )))  # fmt: skip
    if problems or not input_schema_ok:
        return problems
    name = doc.get("name", "?")
    context = {"scheduled_at": SAMPLE_TICK, "schedule": str(raw.get("name", ""))}
    try:
        value = compile_template(template).render({"input": {}, "steps": {}, "context": context})
        validate_payload(doc.get("input", True), value, "schedule input")
    except ExpressionError as exc:
        problems.append(Problem(where, str(exc)))
    except InputError as exc:
        problems.append(Problem(where, (
            f"this input fails the input schema of {name} (for a tick at {SAMPLE_TICK}): "
            f"{exc.message.removeprefix('invalid schedule input: ')}"
        )))  # fmt: skip
    return problems


def build_schedules(doc: Mapping[str, Any]) -> tuple[ScheduleDeclaration, ...]:
    """The schedules of a document that passed every check, in document order."""
    declarations = []
    for raw in doc.get("schedules", []):
        cadence = parse_cadence(
            **{key: raw[key] for key in ("cron", "every", "offset", "timezone") if key in raw}
        )
        catchup, window = parse_catchup(raw.get("catchup", "latest"))
        declarations.append(
            ScheduleDeclaration(
                name=raw["name"],
                cadence=cadence,
                input=raw.get("input", {}),
                tenant=raw.get("tenant", "default"),
                tags=types.MappingProxyType(dict(raw.get("tags", {}))),
                overlap=raw.get("overlap", "skip"),
                catchup=catchup,
                catchup_window=window,
                pause_after_failures=raw.get("pause_after_failures"),
            )
        )
    return tuple(declarations)
