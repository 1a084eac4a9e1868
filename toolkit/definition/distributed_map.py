"""Checks of a ``map`` step beyond the schema: which fields go with ``distributed``.

The schema says what each field is; these say which belong together: a distributed map
lists its items from ``items_from`` and runs child tasks of ``workflow``, an inline map runs
``branch`` over ``items`` in the task's lease, and the fields of one are refused on the
other with what to use instead (docs/composition.md#distributed-map).
"""

from __future__ import annotations

from typing import Any

from toolkit.definition.paths import JsonPath
from toolkit.definition.references import template_problems
from toolkit.definition.step_checks import _duration_problems, _retry_rule_problems
from toolkit.definition.yaml_source import Problem

#: Fields of an inline map that a distributed one has no use for, and why.
_INLINE_ONLY = {
    "items": "a distributed map lists its items from items_from",
    "branch": "a distributed map runs child tasks of `workflow`",
    "cancel_losers": "a distributed map cancels its live children once failures pass"
    " tolerated_failures",
    "reserve": "a distributed map's children spend their own tenant's budget",
}
#: Fields of a distributed map that an inline one refuses.
_DISTRIBUTED_ONLY = (
    "items_from", "workflow", "input", "items_per_task", "tolerated_failures",
    "tolerated_failure_percentage",
)  # fmt: skip


def map_problems(path: JsonPath, mapped: dict[str, Any], depth: int) -> list[Problem]:
    """Problems of the ``map`` object ``mapped`` of the step at ``path``.

    Args:
        path: the step's JSON path.
        mapped: the step's ``map`` object.
        depth: how many parallel or map steps enclose the step (0: the top level).
    """
    where = (*path, "map")
    if mapped.get("distributed") is not True:
        return [
            Problem((*where, name), f"{name} belongs to a distributed map: add distributed: true")
            for name in _DISTRIBUTED_ONLY
            if name in mapped
        ]
    problems = [
        Problem((*where, name), f"{name} is not used by a distributed map: {why}")
        for name, why in _INLINE_ONLY.items()
        if name in mapped
    ]
    if depth > 0:
        message = (
            "a distributed map runs at a workflow's top level only: a branch runs inside its "
            "task's lease; start a child workflow that holds the distributed map"
        )
        problems.append(Problem((*where, "distributed"), message))
    source = mapped.get("items_from")
    if isinstance(source, dict):
        problems += _source_problems((*where, "items_from"), source)
    if "input" in mapped:
        problems += template_problems((*where, "input"), mapped["input"])
    return problems


def _source_problems(where: JsonPath, source: dict[str, Any]) -> list[Problem]:
    """Problems of an ``items_from``: one source, and only its own fields."""
    if ("effect" in source) == ("file" in source):
        given = "both are given" if "effect" in source else "neither is given"
        message = f"items_from takes exactly one of effect (a page source) and file: {given}"
        return [Problem(where, message)]
    if "file" in source:
        return [
            Problem((*where, name), f"{name} goes with items_from.effect, not a file")
            for name in ("args", "retry", "timeout")
            if name in source
        ] + template_problems((*where, "file"), source["file"])
    problems = []
    if "page_size" in source:
        problems.append(
            Problem((*where, "page_size"), "page_size goes with items_from.file: an effect"
                    " returns pages of the size it chooses")
        )  # fmt: skip
    if "args" in source:
        args = source["args"]
        if not isinstance(args, dict):
            problems.append(
                Problem((*where, "args"), "items_from.args must be an object (cursor is added"
                        " to it)")
            )  # fmt: skip
        problems += template_problems((*where, "args"), args)
    return (
        problems
        + _duration_problems(where, source)
        + _retry_rule_problems(where, source.get("retry"))
    )
