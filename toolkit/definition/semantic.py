"""Every check beyond the JSON Schema, run on the document and, the same way, in each branch.

Each check returns `Problem`s (a path as parts, a message, maybe a line) and
never raises on malformed input: the semantic checks read the raw document
defensively, so they run (and report) even when the schema already failed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from toolkit.definition.distributed_map import map_problems
from toolkit.definition.events import (
    cancel_on_problems,
    event_schema_problems,
    trigger_problems,
)
from toolkit.definition.flow_control import flow_control_problems
from toolkit.definition.graph import _graph_problems, _Scope
from toolkit.definition.input_schema import input_schema_problems
from toolkit.definition.model import MAX_FANOUT_DEPTH
from toolkit.definition.paths import JsonPath
from toolkit.definition.references import (
    _single_expression_problems,
    reference_problems,
    tag_problems,
    template_problems,
)
from toolkit.definition.schedules import schedule_problems
from toolkit.definition.step_checks import _duration_problems, _reserve_problems, _step_problems
from toolkit.definition.wording import closest, suggest
from toolkit.definition.yaml_source import Problem


def semantic_problems(doc: Any, flagged: Collection[JsonPath]) -> list[Problem]:
    """Checks beyond the schema: graph, expressions, durations, input schema.

    The graph checks and the step checks run at the top level and, the same way, in every
    branch of a parallel or map step (each branch is a graph of its own).

    Args:
        doc: The document, possibly schema-invalid (read defensively).
        flagged: Paths that already have a schema fault. A step with a fault is assumed able
            to finish, and one whose transitions may be misread (a fault on the step itself,
            one of its fields, or its choice rules) stops the unreachable-step check, so one
            fault does not cascade into many.
    """
    if not isinstance(doc, dict):
        return []
    problems = []
    steps = doc.get("steps")
    on_timeout = doc.get("on_timeout")
    entries = []
    if isinstance(on_timeout, str) and isinstance(steps, dict) and steps:
        # A misspelt on_timeout enters the step it likely means: no cascade of "unreachable".
        meant = on_timeout if on_timeout in steps else closest(on_timeout, list(steps))
        if meant is not None:
            entries.append(meant)
        if on_timeout not in steps:
            problems.append(
                Problem(
                    ("on_timeout",),
                    f"'on_timeout' step {on_timeout!r} does not exist"
                    + suggest(on_timeout, list(steps)),
                )
            )
    problems += _graph_and_step_problems(doc.get("start"), (), steps, flagged, None, entries)
    problems += reference_problems(steps)
    problems += tag_problems(doc.get("tags"))
    problems += flow_control_problems(doc)
    problems += trigger_problems(doc.get("triggers"), doc.get("events"))
    problems += cancel_on_problems(doc.get("cancel_on"))
    problems += event_schema_problems(doc.get("events"))
    problems += _duration_problems((), {k: v for k, v in doc.items() if k == "timeout"})
    defaults = doc.get("defaults")
    if isinstance(defaults, dict):
        problems += _duration_problems(("defaults",), defaults)
    input_problems = input_schema_problems(doc["input"]) if "input" in doc else []
    problems += input_problems
    problems += schedule_problems(doc, input_schema_ok=not input_problems)
    if isinstance(steps, dict):
        problems += _reserve_problems(doc.get("budget"), steps)
    return problems


def _graph_and_step_problems(
    start: Any,
    holder: JsonPath,
    raw_steps: Any,
    flagged: Collection[JsonPath],
    scope: _Scope | None,
    entries: Collection[str] = (),
    depth: int = 0,
) -> list[Problem]:
    """The graph and step checks of the steps at ``holder`` (the document, or a branch).

    ``depth``: how many parallel or map steps enclose them (0: the top level).
    """
    steps = (
        {k: v for k, v in raw_steps.items() if isinstance(v, dict)}
        if isinstance(raw_steps, dict)
        else {}
    )
    problems = _graph_problems(start, holder, steps, flagged, scope, entries)
    outside = [*(scope.outside if scope else ()), *steps]
    for step_id, step in steps.items():
        path = (*holder, "steps", step_id)
        problems += _step_problems(path, step)
        problems += _composite_problems(path, step, flagged, outside, depth)
    return problems


def _composite_problems(
    path: JsonPath,
    step: dict[str, Any],
    flagged: Collection[JsonPath],
    outside: list[str],
    depth: int,
) -> list[Problem]:
    """Check the branches of a parallel or map step, a map's items, a child's input.

    A parallel or map step inside a branch (``depth`` > 0) nests at most
    `MAX_FANOUT_DEPTH` deep and reserves nothing: its branches spend from what the branch
    holding it may spend.
    """
    problems = []
    for kind in ("parallel", "map"):
        body = step.get(kind)
        if body is None:
            continue
        if depth >= MAX_FANOUT_DEPTH:
            message = (
                f"a {kind} step nested {depth + 1} deep: parallel and map steps nest at most"
                f" {MAX_FANOUT_DEPTH} deep; put the inner ones in a child workflow"
            )
            return [Problem((*path, kind), message)]
        if depth > 0 and isinstance(body, dict) and "reserve" in body:
            message = (
                f"reserve is allowed on a top-level {kind} step only: a nested one's branches"
                " spend from what the branch holding it may spend"
            )
            problems.append(Problem((*path, kind, "reserve"), message))
    parallel = step.get("parallel")
    branches = parallel.get("branches") if isinstance(parallel, dict) else None
    if isinstance(branches, dict):
        for name, branch in branches.items():
            if isinstance(branch, dict):
                scope = _Scope(f"branch {name!r}", outside)
                holder = (*path, "parallel", "branches", name)
                problems += _graph_and_step_problems(
                    branch.get("start"), holder, branch.get("steps"), flagged, scope,
                    depth=depth + 1,
                )  # fmt: skip
    mapped = step.get("map")
    if isinstance(mapped, dict):
        problems += map_problems(path, mapped, depth)
        items = mapped.get("items")
        if isinstance(items, str):
            problems += _single_expression_problems((*path, "map", "items"), items)
        branch = mapped.get("branch")
        if isinstance(branch, dict):
            scope = _Scope("the map branch", outside)
            problems += _graph_and_step_problems(
                branch.get("start"), (*path, "map", "branch"), branch.get("steps"), flagged, scope,
                depth=depth + 1,
            )  # fmt: skip
    return problems + _child_input_problems(path, step)


def _child_input_problems(path: JsonPath, step: dict[str, Any]) -> list[Problem]:
    """Check the input expressions of a workflow step's child."""
    child = step.get("workflow")
    if isinstance(child, dict) and "input" in child:
        return template_problems((*path, "workflow", "input"), child["input"])
    return []
