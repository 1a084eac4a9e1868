"""The checks behind `toolkit.definition`: schema faults made readable, then graph checks.

Each check returns `Problem`s (a path as parts, a message, maybe a line) and
never raises on malformed input: the semantic checks read the raw document
defensively, so they run (and report) even when the schema already failed.
"""

from __future__ import annotations

import datetime
import difflib
import json
import reprlib
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from jsonschema_specifications import REGISTRY as _SPECIFICATIONS  # type: ignore[import-untyped]
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from toolkit.definition.expressions import check_template, compile_template, scope_reads
from toolkit.definition.paths import JsonPath, format_path
from toolkit.definition.yaml_source import Problem
from toolkit.durations import parse_duration

_ENDS_WITHOUT_NEXT = ("effect", "wait", "parallel", "map", "workflow", "set")
"""Step kinds that end the workflow (or the branch) when they have no ``next`` (a wait with
``any`` excepted: its events route)."""

_MISPLACED = {
    ("retry policy", "errors"): (
        "'errors' is only allowed when retry is a list of policies"
        " (retry: [{errors: [...], max_attempts: ...}, ...])"
    ),
}
"""Messages for a known field in the wrong place, by the ``title`` of the object holding it."""

_CAN_FAIL = "effect, wait, parallel, map and workflow"
"""The step kinds that may have ``catch``, for messages."""

_DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_SUBSCHEMA = (
    *("additionalProperties", "items", "contains", "not", "if", "then", "else"),
    *("propertyNames", "unevaluatedItems", "unevaluatedProperties"),
)
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxdict = 4
_short.maxlist = 4


def short(value: Any) -> str:
    """A repr of ``value`` short enough for a one-line message."""
    return _short.repr(value)


def closest(word: str, choices: Iterator[str] | list[str]) -> str | None:
    """The choice closest to ``word`` (a likely misspelling of it), or None."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(word: str, choices: Iterator[str] | list[str]) -> str:
    """Return ``"; did you mean 'x'?"`` for the closest choice, or ``""``."""
    meant = closest(word, choices)
    return f"; did you mean {meant!r}?" if meant else ""


def json_type(value: Any) -> str:
    """The JSON type name of a Python value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


# --- schema faults ----------------------------------------------------------------------------


def schema_problems(
    doc: Any, validator: Draft202012Validator
) -> tuple[list[Problem], list[Problem]]:
    """Validate ``doc`` with a validator of the workflow schema.

    Returns:
        The problems of the most relevant error (`best_match`) and those of all others.
    """
    errors = list(validator.iter_errors(doc))
    if not errors:
        return [], []
    top = best_match(errors)
    while top is not None and top.parent is not None:
        top = top.parent
    lead = [e for e in errors if e is top] or errors[:1]
    rest = [e for e in errors if e is not lead[0]]
    kinds = _step_kinds(validator.schema)
    return _translate(lead[0], kinds), [p for e in rest for p in _translate(e, kinds)]


@dataclass(frozen=True)
class _Family:
    """The step kinds of one ``oneOf`` of the schema: any step, or a step inside a branch.

    Attributes:
        alternatives: The ``oneOf`` list itself (recognises the errors it causes).
        kinds: The kind keys, in ``oneOf`` order.
        defs: The kinds' definitions, in the same order.
        in_branch: Whether these are the kinds allowed inside a branch.
    """

    alternatives: list[Any]
    kinds: list[str]
    defs: list[Any]
    in_branch: bool

    def describe(self) -> str:
        """Name the allowed kinds, for a message."""
        if self.in_branch:
            return f"a branch step is one of {', '.join(self.kinds)}"
        return f"v1 has {', '.join(self.kinds)}"


@dataclass(frozen=True)
class _Kinds:
    """Every step kind of the schema, and the families of kinds allowed where."""

    all: list[str]
    families: list[_Family]

    def family_of(self, alternatives: Any) -> _Family | None:
        """The family whose ``oneOf`` is ``alternatives``, or None."""
        return next((f for f in self.families if f.alternatives == alternatives), None)

    def step_family(self, subschema: Any) -> _Family | None:
        """The family of which ``subschema`` is a kind's definition, or None."""
        return next(
            (f for f in self.families if any(d is subschema or d == subschema for d in f.defs)),
            None,
        )


def _step_kinds(schema: Any) -> _Kinds:
    """Step kinds of ``$defs.step`` and ``$defs.branchStep``, in ``oneOf`` order.

    Each kind's def lists its key first in ``required``.
    """
    defs = schema["$defs"]
    families = []
    for name in ("step", "branchStep"):
        if name not in defs:
            continue
        alternatives = defs[name]["oneOf"]
        kind_defs = [defs[branch["$ref"].rsplit("/", 1)[1]] for branch in alternatives]
        kinds = [kind_def["required"][0] for kind_def in kind_defs]
        families.append(_Family(alternatives, kinds, kind_defs, name == "branchStep"))
    return _Kinds(families[0].kinds, families)


def _translate(error: ValidationError, kinds: _Kinds) -> list[Problem]:
    """Turn one jsonschema error into problems an author can act on."""
    path: JsonPath = tuple(error.absolute_path)
    instance, keyword, subschema = error.instance, error.validator, error.schema
    if keyword == "additionalProperties" and isinstance(instance, dict):
        allowed = list(subschema.get("properties", {})) if isinstance(subschema, dict) else []
        family = kinds.step_family(subschema)
        problems = []
        title = str(subschema.get("title")) if isinstance(subschema, dict) else ""
        for key in (k for k in instance if k not in allowed):
            if family is not None and family.in_branch and key in kinds.all:
                message = _not_in_branch(key, family)
            elif (title, key) in _MISPLACED:
                message = _MISPLACED[(title, key)]
            elif family is not None and key == "catch":
                kind = family.kinds[family.defs.index(subschema)]
                message = (
                    f"unknown field 'catch': a {kind} step cannot fail into catch (only {_CAN_FAIL}"
                    " steps can)"
                )
            else:
                message = f"unknown field {key!r}{suggest(key, allowed)}"
            problems.append(Problem((*path, key), message))
        return problems
    if keyword == "required" and isinstance(instance, dict) and isinstance(subschema, dict):
        return [
            Problem(path, f"missing required field {name!r}")
            for name in subschema.get("required", [])
            if name not in instance
        ]
    family = kinds.family_of(error.validator_value) if keyword == "oneOf" else None
    if family is not None and isinstance(instance, dict):
        return _translate_step(error, path, instance, family, kinds)
    if keyword == "oneOf" and isinstance(instance, dict):
        keys = _exclusive_keys(error.validator_value)
        if keys:
            present = [key for key in keys if key in instance]
            if present:
                message = f"needs exactly one of {', '.join(keys)}, got {', '.join(present)}"
            else:
                message = f"needs one of {', '.join(keys)}"
            return [Problem(path, message)]
    if keyword == "dependentRequired" and isinstance(instance, dict):
        dependencies = error.validator_value if isinstance(error.validator_value, dict) else {}
        return [
            Problem((*path, key), f"{key!r} is allowed only with {' and '.join(map(repr, needs))}")
            for key, needs in dependencies.items()
            if key in instance and any(need not in instance for need in needs)
        ] or [Problem(path, error.message)]
    if keyword == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        got = (
            json_type(instance) if instance is None else f"{json_type(instance)} {short(instance)}"
        )
        return [Problem(path, f"expected {wanted}, got {got}")]
    if "propertyNames" in error.relative_schema_path and isinstance(instance, str):
        path = (*path, instance)
    if keyword == "pattern" and isinstance(subschema, dict) and "title" in subschema:
        examples = subschema.get("examples")
        hint = f" (e.g. {', '.join(map(str, examples))})" if examples else ""
        return [Problem(path, f"{short(instance)} is not a valid {subschema['title']}{hint}")]
    if keyword == "minProperties" and path[-1:] == ("steps",):
        return [Problem(path, "define at least one step")]
    if keyword == "minProperties" and path[-1:] == ("branches",):
        return [Problem(path, "define at least one branch")]
    if keyword == "minProperties" and path[-1:] in (("total",), ("per_branch",)):
        return [Problem(path, "name at least one resource to reserve")]
    if keyword == "minProperties" and path[-1:] == ("set",):
        return [Problem(path, "set at least one value")]
    if keyword == "minItems" and path[-1:] == ("any",):
        return [Problem(path, "list at least one event to wait for")]
    if keyword == "minItems" and path[-1:] == ("retry",):
        return [Problem(path, "list at least one retry policy, or give one policy as an object")]
    if keyword == "exclusiveMinimum":
        return [Problem(path, f"{short(instance)} must be greater than {error.validator_value}")]
    if keyword == "enum" and isinstance(error.validator_value, list):
        choices = [str(choice) for choice in error.validator_value]
        hint = suggest(instance, choices) if isinstance(instance, str) else ""
        return [Problem(path, f"{short(instance)} is not one of {', '.join(choices)}{hint}")]
    if keyword == "uniqueItems" and isinstance(instance, list):
        repeated = next((item for i, item in enumerate(instance) if item in instance[:i]), None)
        return [Problem(path, f"has non-unique elements: {short(repeated)} is listed twice")]
    if keyword in ("oneOf", "anyOf") and error.context:
        fitting = _fitting_alternatives(error)
        if len(fitting) == 1:
            return [problem for sub in fitting[0] for problem in _translate(sub, kinds)]
        deepest = best_match(error.context)
        if deepest is not None:
            return _translate(deepest, kinds)
    return [
        Problem(path, error.message if len(error.message) < 200 else error.message[:197] + "...")
    ]


def _fitting_alternatives(error: ValidationError) -> list[list[ValidationError]]:
    """The errors of each ``oneOf`` / ``anyOf`` alternative whose type fits the instance.

    An alternative that refuses the instance's type (``retry`` given as an object fails the
    list alternative) says nothing useful; the errors of the others do.
    """
    by_alternative: dict[Any, list[ValidationError]] = {}
    for sub in error.context or []:
        if sub.relative_schema_path:
            by_alternative.setdefault(sub.relative_schema_path[0], []).append(sub)
    return [
        subs
        for subs in by_alternative.values()
        if not any(
            sub.validator == "type" and sub.absolute_path == error.absolute_path for sub in subs
        )
    ]


def _exclusive_keys(branches: Any) -> list[str]:
    """The keys of a ``oneOf`` of ``{"required": [key]}`` branches (one key of several), or []."""
    if not isinstance(branches, list):
        return []
    keys = []
    for branch in branches:
        if not (isinstance(branch, dict) and list(branch) == ["required"]):
            return []
        if not (isinstance(branch["required"], list) and len(branch["required"]) == 1):
            return []
        keys.append(str(branch["required"][0]))
    return keys


def _translate_step(
    error: ValidationError,
    path: JsonPath,
    step: dict[str, Any],
    family: _Family,
    kinds: _Kinds,
) -> list[Problem]:
    """Explain why a step matches no kind: by the kind key it has, not by every alternative."""
    present = [kind for kind in kinds.all if kind in step]
    if len(present) == 1 and present[0] in family.kinds:
        alternative = family.kinds.index(present[0])
        problems = [
            problem
            for sub in error.context or []
            if sub.relative_schema_path and sub.relative_schema_path[0] == alternative
            for problem in _translate(sub, kinds)
        ]
        return problems or [Problem(path, f"invalid {present[0]} step")]
    if len(present) == 1:
        return [Problem((*path, present[0]), _not_in_branch(present[0], family))]
    if present:
        return [Problem(path, f"a step has exactly one kind, this one has {', '.join(present)}")]
    hint = next((suggest(key, family.kinds) for key in step if suggest(key, family.kinds)), "")
    what = "a branch step" if family.in_branch else "a step"
    return [Problem(path, f"{what} needs one of {', '.join(family.kinds)}{hint}")]


def _not_in_branch(kind: str, family: _Family) -> str:
    return (
        f"a {kind} step is not allowed inside a branch ({family.describe()}): put it before or"
        " after the parallel or map step, or in a child workflow"
    )


# --- semantic checks --------------------------------------------------------------------------


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
    problems += _duration_problems((), {k: v for k, v in doc.items() if k == "timeout"})
    defaults = doc.get("defaults")
    if isinstance(defaults, dict):
        problems += _duration_problems(("defaults",), defaults)
    if "input" in doc:
        problems += input_schema_problems(doc["input"])
    if isinstance(steps, dict):
        problems += _reserve_problems(doc.get("budget"), steps)
    return problems


def _reserve_problems(budget: Any, steps: dict[str, Any]) -> list[Problem]:
    """Reservations larger than the definition's own budget for that resource.

    Such a step could never start (with a submit that does not raise the budget); a
    per-branch amount of a parallel step counts once per branch (a map's item count is only
    known at run time, so one share is compared).
    """
    if not isinstance(budget, dict):
        return []
    problems = []
    for step_id, step in steps.items():
        for kind in ("parallel", "map"):
            body = step.get(kind) if isinstance(step, dict) else None
            if not isinstance(body, dict) or not isinstance(body.get("reserve"), dict):
                continue
            reserve = body["reserve"]
            for how in ("total", "per_branch"):
                amounts = reserve.get(how)
                if not isinstance(amounts, dict):
                    continue
                branches = body.get("branches") if kind == "parallel" else None
                factor = len(branches) if how == "per_branch" and isinstance(branches, dict) else 1
                for resource, amount in amounts.items():
                    limit = budget.get(resource)
                    if not _number(amount) or not _number(limit) or amount * factor <= limit:
                        continue
                    times = f" ({factor} branches x {amount:g})" if factor > 1 else ""
                    problems.append(
                        Problem(
                            ("steps", step_id, kind, "reserve", how, resource),
                            f"reserves {amount * factor:g}{times} {resource}, more than the "
                            f"definition's budget of {limit:g}",
                        )
                    )
    return problems


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Scope:
    """A branch whose graph is checked: how messages name it, and the steps outside it."""

    name: str
    outside: Collection[str]


def _graph_and_step_problems(
    start: Any,
    holder: JsonPath,
    raw_steps: Any,
    flagged: Collection[JsonPath],
    scope: _Scope | None,
    entries: Collection[str] = (),
) -> list[Problem]:
    """The graph and step checks of the steps at ``holder`` (the document, or a branch)."""
    steps = (
        {k: v for k, v in raw_steps.items() if isinstance(v, dict)}
        if isinstance(raw_steps, dict)
        else {}
    )
    problems = _graph_problems(start, holder, steps, flagged, scope, entries)
    for step_id, step in steps.items():
        path = (*holder, "steps", step_id)
        problems += _step_problems(path, step)
        if scope is None:  # inside a branch, these kinds are schema faults already
            problems += _composite_problems(path, step, flagged, list(steps))
    return problems


def _composite_problems(
    path: JsonPath, step: dict[str, Any], flagged: Collection[JsonPath], outside: list[str]
) -> list[Problem]:
    """Check the branches of a parallel or map step, a map's items, a child's input."""
    problems = []
    parallel = step.get("parallel")
    branches = parallel.get("branches") if isinstance(parallel, dict) else None
    if isinstance(branches, dict):
        for name, branch in branches.items():
            if isinstance(branch, dict):
                scope = _Scope(f"branch {name!r}", outside)
                holder = (*path, "parallel", "branches", name)
                problems += _graph_and_step_problems(
                    branch.get("start"), holder, branch.get("steps"), flagged, scope
                )
    mapped = step.get("map")
    if isinstance(mapped, dict):
        items = mapped.get("items")
        if isinstance(items, str):
            problems += _single_expression_problems((*path, "map", "items"), items)
        branch = mapped.get("branch")
        if isinstance(branch, dict):
            scope = _Scope("the map branch", outside)
            problems += _graph_and_step_problems(
                branch.get("start"), (*path, "map", "branch"), branch.get("steps"), flagged, scope
            )
    child = step.get("workflow")
    if isinstance(child, dict) and "input" in child:
        problems += template_problems((*path, "workflow", "input"), child["input"])
    return problems


def _single_expression_problems(path: JsonPath, text: str) -> list[Problem]:
    """Problems of a field that must be exactly one ``${ ... }`` expression."""
    found = template_problems(path, text)
    if not found and not compile_template(text).is_expression:
        found = [
            Problem(
                path,
                f"{path[-1]!r} must be one '${{ ... }}' expression, not a text template: {text!r}",
            )
        ]
    return found


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
    for step_id in steps:
        if step_id not in reachable and not blind & reachable:
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


def _step_problems(path: JsonPath, step: dict[str, Any]) -> list[Problem]:
    problems = []
    if "args" in step:
        problems += template_problems((*path, "args"), step["args"])
    problems += _duration_problems(path, step)
    problems += _retry_rule_problems(path, step.get("retry"))
    callback = step.get("callback")
    if isinstance(callback, dict):
        problems += _duration_problems((*path, "callback"), callback)
    compensate = step.get("compensate")
    if isinstance(compensate, dict) and "args" in compensate:
        problems += template_problems((*path, "compensate", "args"), compensate["args"])
    if "set" in step:
        problems += template_problems((*path, "set"), step["set"])
    rules = step.get("choice")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        when = rule.get("when") if isinstance(rule, dict) else None
        if isinstance(when, str):
            problems += _single_expression_problems((*path, "choice", i, "when"), when)
    for kind, field in (("succeed", "output"), ("fail", "message")):
        body = step.get(kind)
        if isinstance(body, dict) and field in body:
            problems += template_problems((*path, kind, field), body[field])
    wait = step.get("wait")
    if isinstance(wait, dict):
        problems += _wait_problems((*path, "wait"), wait)
        if "any" in wait and "next" in step:
            problems.append(
                Problem(
                    (*path, "next"),
                    "'next' is not allowed on a wait with 'any': each event names its own next",
                )
            )
        seen: dict[str, int] = {}
        for i, event in _wait_events(step):
            problems += _wait_problems((*path, "wait", "any", i), event)
            signal = event.get("signal")
            if isinstance(signal, str) and signal in seen:
                problems.append(
                    Problem(
                        (*path, "wait", "any", i, "signal"),
                        f"signal {signal!r} is already awaited by any[{seen[signal]}]: wait for"
                        " each signal at most once",
                    )
                )
            elif isinstance(signal, str):
                seen[signal] = i
    problems += _catch_problems(path, step)
    return problems


def _retry_rule_problems(path: JsonPath, rules: Any) -> list[Problem]:
    """Durations of a list of retry policies, and policies that can never apply."""
    if not isinstance(rules, list):
        return []
    problems = []
    covered: set[str] = set()
    everything = False
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        problems += _duration_problems((*path, "retry", i), rule)
        errors = rule.get("errors")
        exempt = rule.get("non_retryable")
        if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
            continue
        exempt = (
            set(exempt)
            if isinstance(exempt, list) and all(isinstance(e, str) for e in exempt)
            else set()
        )
        if errors and (everything or ("*" not in errors and covered.issuperset(errors))):
            earlier = "'*'" if everything else ", ".join(map(repr, errors))
            problems.append(
                Problem(
                    (*path, "retry", i),
                    f"this policy never applies: earlier policies already cover {earlier}",
                )
            )
        everything = everything or ("*" in errors and not exempt)
        covered.update(e for e in errors if e != "*" and e not in exempt)
    return problems


def _wait_problems(path: JsonPath, wait: dict[str, Any]) -> list[Problem]:
    """Check the durations, ``until`` and payload ``schema`` of a wait or a ``wait.any`` event."""
    problems = []
    for key in ("duration", "timeout"):
        if key in wait:
            try:
                seconds = parse_duration(wait[key])
            except ValueError as exc:
                problems.append(Problem((*path, key), str(exc)))
                continue
            if seconds <= 0:
                problems.append(Problem((*path, key), f"{key} must be greater than zero"))
    if "schema" in wait:
        problems += input_schema_problems(wait["schema"], (*path, "schema"), "signal schema")
    until = wait.get("until")
    if isinstance(until, str):
        found = template_problems((*path, "until"), until)
        if found:
            return problems + found
        template = compile_template(until)
        if template.is_constant:
            problems += [Problem((*path, "until"), m) for m in timestamp_problems(until)]
        elif not template.is_expression:
            problems.append(
                Problem(
                    (*path, "until"),
                    f"'until' must be one '${{ ... }}' expression or a constant timestamp, not a"
                    f" text template: {until!r}",
                )
            )
    return problems


def timestamp_problems(text: str) -> list[str]:
    """Why ``text`` is not an ISO-8601 timestamp with a UTC offset (empty when it is one)."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return [
            f"{short(text)} is not an ISO-8601 timestamp (e.g. 2030-01-01T09:00:00+01:00,"
            " 2030-01-01T08:00:00Z)"
        ]
    if moment.utcoffset() is None:
        return [
            f"timestamp {short(text)} has no UTC offset: add one (e.g. Z or +01:00), a wait"
            " cannot depend on the worker's time zone"
        ]
    return []


def _catch_problems(path: JsonPath, step: dict[str, Any]) -> list[Problem]:
    """Catch rules that can never match: on a wait that cannot fail, or shadowed by earlier ones."""
    rules = step.get("catch")
    if not isinstance(rules, list):
        return []
    wait = step.get("wait")
    if isinstance(wait, dict):
        if "signal" not in wait or "timeout" not in wait:
            if "any" in wait:
                hint = ": a wait with 'any' never fails, each of its events goes to its own next"
            elif "signal" in wait:
                hint = ": add a timeout to the signal wait, or remove catch"
            else:
                hint = ": only a signal wait with a timeout can fail"
            return [
                Problem(
                    (*path, "catch"),
                    f"catch needs a wait that can fail (signal with timeout){hint}",
                )
            ]
    problems = []
    caught: set[str] = set()
    for i, rule in enumerate(rules):
        errors = rule.get("errors") if isinstance(rule, dict) else None
        if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
            continue
        if isinstance(wait, dict):
            for j, name in enumerate(errors):
                if name not in ("*", "Timeout"):
                    problems.append(
                        Problem(
                            (*path, "catch", i, "errors", j),
                            f"a signal wait fails only with 'Timeout', never with {name!r}",
                        )
                    )
        if errors and ("*" in caught or caught.issuperset(errors)):
            earlier = "'*'" if "*" in caught else ", ".join(map(repr, errors))
            problems.append(
                Problem(
                    (*path, "catch", i),
                    f"this rule never matches: earlier rules already catch {earlier}",
                )
            )
        caught.update(errors)
    return problems


#: What an expression can read: the task input, the steps' outputs, the context.
SCOPE_NAMES = ("input", "steps", "context")


def reference_problems(steps: Any) -> list[Problem]:
    """Names no expression can ever read, which are null for every task: mistakes.

    A name outside `SCOPE_NAMES` (``stpes.a``), ``true`` / ``false`` read as fields, or a
    step that no graph of the definition has (``steps.reserv``).

    Args:
        steps: The document's ``steps`` (raw); branches are searched too.
    """
    known = sorted(_step_ids(steps))
    problems = []
    for path, text in _expression_strings(steps, ("steps",)):
        for expression, name, field in scope_reads(text):
            if name == "null":
                continue  # a field no scope has: null, as `null` is (a common idiom)
            if name in ("true", "false"):
                problems.append(Problem(path, (
                    f"expression {expression!r} reads a field named {name!r}, which is null,"
                    f" not the value {name}: write `{name}` in backquotes"
                )))  # fmt: skip
            elif name not in SCOPE_NAMES:
                problems.append(Problem(path, (
                    f"expression {expression!r} reads {name!r}, which is nothing: an "
                    f"expression reads input, steps or context{suggest(name, list(SCOPE_NAMES))}"
                )))  # fmt: skip
            elif name == "steps" and field is not None and field not in known:
                problems.append(Problem(path, (
                    f"expression {expression!r} reads step {field!r}, which no graph of this "
                    f"definition has{suggest(field, known)}"
                )))  # fmt: skip
    return problems


def _step_ids(steps: Any) -> set[str]:
    """Every step id of a ``steps`` mapping and of its branches, at any depth."""
    if not isinstance(steps, dict):
        return set()
    ids = {str(step_id) for step_id in steps}
    for step in steps.values():
        if not isinstance(step, dict):
            continue
        branches = step.get("parallel", {}).get("branches") if isinstance(
            step.get("parallel"), dict) else None
        graphs = list(branches.values()) if isinstance(branches, dict) else []
        if isinstance(step.get("map"), dict):
            graphs.append(step["map"].get("branch"))
        for graph in graphs:
            if isinstance(graph, dict):
                ids |= _step_ids(graph.get("steps"))
    return ids


def _expression_strings(value: Any, path: JsonPath) -> Iterator[tuple[JsonPath, str]]:
    """Every string holding ``${`` inside ``value``, with its path."""
    if isinstance(value, str):
        if "${" in value:
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _expression_strings(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _expression_strings(item, (*path, i))


def template_problems(path: JsonPath, value: Any) -> list[Problem]:
    """Syntax problems of every expression inside ``value``, each at its own path."""
    if isinstance(value, str):
        return [
            Problem(path, error.message) for error in check_template(value, path=format_path(path))
        ]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in template_problems((*path, key), item)]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in template_problems((*path, i), item)]
    return []


def _duration_problems(path: JsonPath, holder: dict[str, Any]) -> list[Problem]:
    """Check ``timeout``, ``initial`` / ``max`` and ``retry.initial`` / ``retry.max`` of ``holder``.

    ``holder`` is a step, ``defaults``, a policy of a list of retry policies, a ``callback``
    or the document (its ``timeout``).
    """
    found: list[tuple[JsonPath, Any]] = []
    if "timeout" in holder:
        found.append(((*path, "timeout"), holder["timeout"]))
    if len(path) >= 2 and path[-2] == "retry" and isinstance(path[-1], int):  # in a list
        found += [((*path, k), holder[k]) for k in ("initial", "max") if k in holder]
    retry = holder.get("retry")
    if isinstance(retry, dict):
        found += [((*path, "retry", k), retry[k]) for k in ("initial", "max") if k in retry]
    problems = []
    for where, value in found:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            problems.append(Problem(where, str(exc)))
            continue
        if where[-1] == "timeout" and seconds <= 0:
            problems.append(Problem(where, "timeout must be greater than zero"))
    return problems


# --- the input schema -------------------------------------------------------------------------


def input_schema_problems(
    schema: Any, where: JsonPath = ("input",), what: str = "input schema"
) -> list[Problem]:
    """Check that a JSON Schema is a valid draft 2020-12 schema whose defaults fit it.

    Args:
        schema: The schema (raw).
        where: Its path: the ``input`` schema by default, or a signal's payload ``schema``.
        what: How messages name it.
    """
    if not isinstance(schema, (dict, bool)):
        return []  # the workflow schema reports the type
    meta = Draft202012Validator(
        Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    problems = []
    for error in sorted(meta.iter_errors(schema), key=lambda e: list(map(str, e.absolute_path))):
        detail = best_match([error]) or error  # e.g. "not one of [...]" rather than "anyOf"
        problems.append(
            Problem((*where, *error.absolute_path), f"invalid {what}: {detail.message}")
        )
    if problems or isinstance(schema, bool):
        return problems
    declared = schema.get("$schema")
    if declared is not None and str(declared).rstrip("#") != _DRAFT_2020_12:
        problems.append(
            Problem((*where, "$schema"), f"the {what} must be draft 2020-12 ({_DRAFT_2020_12})")
        )
        return problems
    registry = Registry().combine(_SPECIFICATIONS)
    root = registry.resolver_with_root(DRAFT202012.create_resource(schema))
    validator = input_validator(schema)
    for path, subschema, resolver in _subschemas(schema, where, root):
        ref = subschema.get("$ref")
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            except Unresolvable:
                problems.append(
                    Problem(
                        (*path, "$ref"),
                        f"cannot resolve $ref {ref!r}: only references inside the {what}"
                        " (and to the JSON Schema meta-schemas) are supported",
                    )
                )
                return problems  # validating defaults would hit the same reference
        if "default" in subschema:
            error = best_match(validator.evolve(schema=subschema).iter_errors(subschema["default"]))
            if error is not None:
                problems.append(
                    Problem(
                        (*path, "default"),
                        f"default {short(subschema['default'])} does not match its own schema:"
                        f" {error.message}",
                    )
                )
    return problems


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
        if missing:
            return f"missing required field {json_text(missing[0])}"
    return error.message


def _subschemas(
    schema: Any, path: JsonPath, resolver: Any, *, root: bool = True
) -> Iterator[tuple[JsonPath, dict[str, Any], Any]]:
    """Yield (path, subschema, resolver) for ``schema`` and every schema nested in it."""
    if not isinstance(schema, dict):
        return
    if "$id" in schema and not root:
        resolver = resolver.in_subresource(DRAFT202012.create_resource(schema))
    yield path, schema, resolver
    for keyword in _SUBSCHEMA:
        if keyword in schema:
            yield from _subschemas(schema[keyword], (*path, keyword), resolver, root=False)
    for keyword in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(keyword), list):
            for i, item in enumerate(schema[keyword]):
                yield from _subschemas(item, (*path, keyword, i), resolver, root=False)
    for keyword in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(keyword), dict):
            for name, item in schema[keyword].items():
                yield from _subschemas(item, (*path, keyword, name), resolver, root=False)
