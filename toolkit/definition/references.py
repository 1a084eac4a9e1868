"""Checks of the expressions a definition holds: their syntax, and the names they read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from toolkit.definition.expressions import check_template, compile_template, scope_reads
from toolkit.definition.paths import JsonPath, format_path
from toolkit.definition.wording import suggest
from toolkit.definition.yaml_source import Problem

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
    for path, text in expression_strings(steps, ("steps",)):
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


def tag_problems(tags: Any) -> list[Problem]:
    """Problems of the definition's ``tags``: their expressions' syntax, and reads.

    Tags are given at submit, before any step ran: their expressions read only the input.
    """
    if not isinstance(tags, dict):
        return []
    return reads_only(
        ("tags",),
        tags,
        ("input",),
        "a tag is given at submit, so its expressions read only the input",
    )


def reads_only(path: JsonPath, value: Any, names: tuple[str, ...], why: str) -> list[Problem]:
    """Syntax problems of the expressions inside ``value``, else their reads outside ``names``.

    ``null``, ``true`` and ``false`` are always allowed.

    Args:
        path: where ``value`` is.
        value: a value holding templates.
        names: the scope names its expressions may read.
        why: the end of each message, saying why (``"a tag is given at submit, ..."``).
    """
    problems = template_problems(path, value)
    if problems:
        return problems
    for where, text in expression_strings(value, path):
        for expression, name, _ in scope_reads(text):
            if name not in (*names, "null", "true", "false"):
                problems.append(Problem(where, f"expression {expression!r} reads {name!r}: {why}"))
    return problems


def _step_ids(steps: Any) -> set[str]:
    """Every step id of a ``steps`` mapping and of its branches, at any depth."""
    if not isinstance(steps, dict):
        return set()
    ids = {str(step_id) for step_id in steps}
    for step in steps.values():
        if not isinstance(step, dict):
            continue
        branches = (
            step.get("parallel", {}).get("branches")
            if isinstance(step.get("parallel"), dict)
            else None
        )
        graphs = list(branches.values()) if isinstance(branches, dict) else []
        if isinstance(step.get("map"), dict):
            graphs.append(step["map"].get("branch"))
        for graph in graphs:
            if isinstance(graph, dict):
                ids |= _step_ids(graph.get("steps"))
    return ids


def expression_strings(value: Any, path: JsonPath) -> Iterator[tuple[JsonPath, str]]:
    """Every string holding ``${`` inside ``value``, with its path."""
    if isinstance(value, str):
        if "${" in value:
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from expression_strings(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from expression_strings(item, (*path, i))


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
