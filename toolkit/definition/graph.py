"""Graph checks: every target exists, every step is reachable and every step can finish.

They run on the definition and, the same way, on each branch. The graph is read from the
raw document (defensively): its edges are every ``next``, ``default``, choice rule, catch
rule and ``wait.any`` event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from toolkit.definition.paths import JsonPath
from toolkit.definition.wording import closest, suggest, unreached_hint
from toolkit.definition.yaml_source import Problem

_ENDS_WITHOUT_NEXT = ("effect", "wait", "parallel", "map", "workflow", "set")
"""Step kinds that end the workflow (or the branch) when they have no ``next`` (a wait with
``any`` excepted: its events route)."""


@dataclass(frozen=True)
class _Scope:
    """A branch whose graph is checked: how messages name it, and the steps outside it."""

    name: str
    outside: Collection[str]


def _edges(step: Mapping[str, Any]) -> Iterator[tuple[JsonPath, Any]]:
    """Yield (relative path, target) for every transition a step declares."""
    if "next" in step:
        yield ("next",), step["next"]
    if "default" in step:
        yield ("default",), step["default"]
    rules = step.get("choice")
    if isinstance(rules, list):
        for i, rule in enumerate(rules):
            if isinstance(rule, dict) and "next" in rule:
                yield ("choice", i, "next"), rule["next"]
    rules = step.get("catch")
    if isinstance(rules, list):
        for i, rule in enumerate(rules):
            if isinstance(rule, dict) and "next" in rule:
                yield ("catch", i, "next"), rule["next"]
    for i, event in _wait_events(step):
        if "next" in event:
            yield ("wait", "any", i, "next"), event["next"]


def _wait_events(step: Mapping[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (index, event) for every well-formed event of the step's ``wait.any``."""
    wait = step.get("wait")
    events = wait.get("any") if isinstance(wait, dict) else None
    if isinstance(events, list):
        for i, event in enumerate(events):
            if isinstance(event, dict):
                yield i, event


def _waits_for_any(step: Mapping[str, Any]) -> bool:
    """Whether the step is a wait with ``any`` (it routes by event, it has no end of its own)."""
    wait = step.get("wait")
    return isinstance(wait, dict) and "any" in wait


def _graph_problems(
    start: Any,
    holder: JsonPath,
    steps: dict[str, dict[str, Any]],
    flagged: Collection[JsonPath],
    scope: _Scope | None,
    entries: Collection[str] = (),
) -> list[Problem]:
    """Check that ``start`` and every target exist, every step is reachable and can finish.

    Args:
        start: The ``start`` of the graph (raw).
        holder: Path of the object holding ``start`` and ``steps``: ``()`` for the document.
        steps: The graph's steps by id (the well-formed ones).
        flagged: Paths with a schema fault.
        scope: The branch being checked, or None for the top level.
        entries: Existing steps entered other than from ``start`` (the ``on_timeout`` step).
    """
    prefix = (*holder, "steps")
    faulty = {
        str(p[len(prefix)]) for p in flagged if len(p) > len(prefix) and p[: len(prefix)] == prefix
    }
    blind = {
        step_id
        for step_id in faulty & steps.keys()
        if _blind(steps[step_id], (*prefix, step_id), flagged)
    }
    problems = []
    known = list(steps)
    where = f" in {scope.name}" if scope else ""
    if isinstance(start, str) and steps and start not in steps:
        problems.append(
            Problem(
                (*holder, "start"),
                f"start step {start!r} does not exist{where}{suggest(start, known)}",
            )
        )
    graph: dict[str, list[str]] = {}
    able: set[str] = set()  # steps assumed able to finish on their own
    lost: dict[str, list[int]] = {}  # step -> its problems of a target like no step's
    for step_id, step in steps.items():
        graph[step_id] = []
        for rel, target in _edges(step):
            if not isinstance(target, str):
                continue
            if target in steps:
                graph[step_id].append(target)
            else:
                able.add(step_id)
                meant = closest(target, known)
                if meant is not None:  # reach the step it likely means: no cascade
                    graph[step_id].append(meant)
                hint = suggest(target, known)
                if not hint and scope and target in scope.outside:
                    hint = ": a branch can only go to its own steps"
                if meant is None:
                    lost.setdefault(step_id, []).append(len(problems))
                problems.append(
                    Problem(
                        (*prefix, step_id, *rel),
                        f"next step {target!r} does not exist{where}{hint}",
                    )
                )
        terminal = any(k in step for k in ("succeed", "fail")) or (
            any(k in step for k in _ENDS_WITHOUT_NEXT)
            and "next" not in step
            and not _waits_for_any(step)
        )
        if terminal or step_id in faulty:
            able.add(step_id)
    first = start if isinstance(start, str) and start in steps else None
    if first is None and isinstance(start, str):
        first = closest(start, known)  # a misspelt start: begin at the step it likely means
    reachable = _closure([first, *entries], graph) if first is not None else set(steps)
    also = "".join(f" or on_timeout {entry!r}" for entry in entries)
    # A reachable step going to a name like no step's may have meant any unreached step: its
    # "does not exist" says it all, without a cascade of "unreachable" (issue 24, item 10).
    unreached = [step_id for step_id in steps if step_id not in reachable]
    if unreached and lost.keys() & reachable:
        hint = unreached_hint(unreached)
        for index in (i for step_id in lost.keys() & reachable for i in lost[step_id]):
            problems[index] = replace(problems[index], message=problems[index].message + hint)
    elif not blind & reachable:
        for step_id in unreached:
            message = (
                f"step {step_id!r} of {scope.name} is unreachable from its start {start!r}"
                if scope
                else f"step {step_id!r} is unreachable from start {start!r}{also}"
            )
            problems.append(Problem((*prefix, step_id), message))
    reverse: dict[str, list[str]] = {step_id: [] for step_id in steps}
    for source, targets in graph.items():
        for target in targets:
            reverse[target].append(source)
    finishing = _closure(able, reverse)
    ends = (
        "a succeed, a fail, or an effect or set step without next"
        if scope
        else "a succeed, a fail, or an effect, wait, parallel, map, workflow or set step without"
        " next"
    )
    for step_id in steps:
        if step_id in reachable and step_id not in finishing:
            name = f"step {step_id!r} of {scope.name}" if scope else f"step {step_id!r}"
            problems.append(
                Problem(
                    (*prefix, step_id),
                    f"{name} can never finish: every path from it loops without reaching {ends}",
                )
            )
    return problems


def _blind(step: Mapping[str, Any], path: JsonPath, flagged: Collection[JsonPath]) -> bool:
    """Tell whether schema faults of the step at ``path`` may hide where it goes next.

    That is: a fault on the step itself or on one of its fields while it has no ``next`` (the
    fault may be a misspelt ``next``), a fault in its choice rules or catch rules, or an unknown
    field that looks like a misspelt ``catch``.
    """
    faults = [p[len(path) :] for p in flagged if p[: len(path)] == path]
    if any(rel[:1] == ("catch",) for rel in faults):
        return True
    if any(len(rel) == 1 and suggest(str(rel[0]), ["catch"]) for rel in faults):
        return True
    if "choice" in step:
        return any(len(rel) <= 1 or rel[0] == "choice" for rel in faults)
    if _waits_for_any(step) and any(rel[:1] == ("wait",) for rel in faults):
        return True
    return any(rel[:1] == ("next",) or (len(rel) <= 1 and "next" not in step) for rel in faults)


def _closure(roots: Any, graph: Mapping[str, list[str]]) -> set[str]:
    """All nodes reachable from ``roots`` (included) along ``graph``."""
    seen = set(roots)
    queue = deque(seen)
    while queue:
        for target in graph.get(queue.popleft(), []):
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return seen
