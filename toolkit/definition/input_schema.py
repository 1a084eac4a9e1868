"""Checks of the JSON Schemas a definition declares: its ``input`` and signal payload schemas.

Each must be a valid draft 2020-12 schema whose references resolve inside it and whose
``default`` values fit their own schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema_specifications import REGISTRY as _SPECIFICATIONS  # type: ignore[import-untyped]
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from toolkit.definition.json_schema import Draft202012Validator, best_match
from toolkit.definition.paths import JsonPath
from toolkit.definition.payloads import input_validator
from toolkit.definition.wording import short
from toolkit.definition.yaml_source import Problem

_DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_SUBSCHEMA = (
    *("additionalProperties", "items", "contains", "not", "if", "then", "else"),
    *("propertyNames", "unevaluatedItems", "unevaluatedProperties"),
)
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


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
