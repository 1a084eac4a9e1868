"""JSON Schema errors of a definition turned into faults an author can act on.

`schema_problems` validates a document against the workflow schema, leads with the most
relevant error (`best_match`) and words each error by what the author wrote: the step kind
a step has, the field that is unknown or misplaced, the one key of several that is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.definition.json_schema import Draft202012Validator, ValidationError, best_match
from toolkit.definition.paths import JsonPath
from toolkit.definition.policies import error_name_problem
from toolkit.definition.wording import json_type, short, suggest
from toolkit.definition.yaml_source import Problem

_MISPLACED = {
    ("retry policy", "errors"): (
        "'errors' is only allowed when retry is a list of policies"
        " (retry: [{errors: [...], max_attempts: ...}, ...])"
    ),
}
"""Messages for a known field in the wrong place, by the ``title`` of the object holding it."""

_NAME_RULES = ("minLength", "maxLength", "not")
"""The keywords of an error name's rule besides its type (``$defs/errorName``, ``errorMatch``)."""

_CAN_FAIL = "effect, wait, parallel, map and workflow"
"""The step kinds that may have ``catch``, for messages."""


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
class _Kinds:
    """The step kinds of the schema (``$defs.step``; a branch's steps are steps too).

    Attributes:
        alternatives: The ``oneOf`` list itself (recognises the errors it causes).
        all: The kind keys, in ``oneOf`` order.
        defs: The kinds' definitions, in the same order.
    """

    alternatives: list[Any]
    all: list[str]
    defs: list[Any]

    def is_step_def(self, subschema: Any) -> bool:
        """Whether ``subschema`` is a kind's definition."""
        return any(d is subschema or d == subschema for d in self.defs)


def _step_kinds(schema: Any) -> _Kinds:
    """Step kinds of ``$defs.step``, in ``oneOf`` order.

    Each kind's def lists its key first in ``required``.
    """
    defs = schema["$defs"]
    alternatives = defs["step"]["oneOf"]
    kind_defs = [defs[branch["$ref"].rsplit("/", 1)[1]] for branch in alternatives]
    return _Kinds(alternatives, [kind_def["required"][0] for kind_def in kind_defs], kind_defs)


def _translate(error: ValidationError, kinds: _Kinds) -> list[Problem]:
    """Turn one jsonschema error into problems an author can act on."""
    path: JsonPath = tuple(error.absolute_path)
    instance, keyword, subschema = error.instance, error.validator, error.schema
    if keyword == "additionalProperties" and isinstance(instance, dict):
        allowed = list(subschema.get("properties", {})) if isinstance(subschema, dict) else []
        step_def = kinds.is_step_def(subschema)
        problems = []
        title = str(subschema.get("title")) if isinstance(subschema, dict) else ""
        for key in (k for k in instance if k not in allowed):
            if (title, key) in _MISPLACED:
                message = _MISPLACED[(title, key)]
            elif step_def and key == "catch":
                kind = kinds.all[kinds.defs.index(subschema)]
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
    if keyword == "oneOf" and error.validator_value == kinds.alternatives:
        if isinstance(instance, dict):
            return _translate_step(error, path, instance, kinds)
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
    named = subschema.get("title") if isinstance(subschema, dict) else None
    if keyword in _NAME_RULES and named == "error name":
        why = error_name_problem(instance)
        if why is not None:
            return [Problem(path, f"{short(instance)} is not a valid error name: {why}")]
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
    error: ValidationError, path: JsonPath, step: dict[str, Any], kinds: _Kinds
) -> list[Problem]:
    """Explain why a step matches no kind: by the kind key it has, not by every alternative."""
    present = [kind for kind in kinds.all if kind in step]
    if len(present) == 1:
        alternative = kinds.all.index(present[0])
        problems = [
            problem
            for sub in error.context or []
            if sub.relative_schema_path and sub.relative_schema_path[0] == alternative
            for problem in _translate(sub, kinds)
        ]
        return problems or [Problem(path, f"invalid {present[0]} step")]
    if present:
        return [Problem(path, f"a step has exactly one kind, this one has {', '.join(present)}")]
    known = {key for kind_def in kinds.defs for key in kind_def.get("properties", {})}
    unknown = [key for key in step if key not in known]
    named = (
        f"; unknown field {unknown[0]!r}" if len(unknown) == 1
        else f"; unknown fields {', '.join(map(repr, unknown))}" if unknown else ""
    )  # fmt: skip
    hint = next((suggest(key, kinds.all) for key in step if suggest(key, kinds.all)), "")
    return [Problem(path, f"a step needs one of {', '.join(kinds.all)}{named}{hint}")]
