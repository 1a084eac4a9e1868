"""A definition's concurrency key: at most ``max_active`` live tasks per key value.

``concurrency: {key: "${ input.account }", max_active: 1, on_conflict: queue}``. The key is
rendered from the input at submit; tasks of one key value (per tenant and definition name)
take it in submission order and hold it from their admission until they end, through their
waits and retries (docs/flow-control.md). The store enforces it (migration
``0015_concurrency_keys``); this module is the declaration and its checks.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from toolkit.definition.expressions import Template, compile_template
from toolkit.definition.references import reads_only
from toolkit.definition.yaml_source import Problem
from toolkit.errors import ExpressionError, InputError

#: What a submit does when the key already has ``max_active`` live tasks.
OnConflict = Literal["queue", "skip", "cancel_running", "cancel_newest"]
#: Longest key value, characters.
MAX_KEY_LENGTH = 256


@dataclasses.dataclass(frozen=True)
class Concurrency:
    """The ``concurrency:`` of a definition.

    Attributes:
        key: renders the key value from ``{"input": ...}`` (a string, number or boolean).
        max_active: most live tasks holding one key value (≥ 1).
        on_conflict: at a submit while the key has ``max_active`` live tasks: ``queue``
            (wait for the key, in submission order), ``skip`` (refuse the submit, naming a
            holder), ``cancel_running`` (cancel the live tasks of the key; the new one takes
            it when they end) or ``cancel_newest`` (the new task is cancelled at once).
    """

    key: Template
    max_active: int = 1
    on_conflict: OnConflict = "queue"

    def key_of(self, value: Any, definition: str) -> str:
        """The key value of a task of input ``value`` (of definition ``definition``).

        Raises:
            InputError: the expression fails, gives null, an object or a list, or a key
                longer than `MAX_KEY_LENGTH`; ``path`` is ``$.concurrency.key``.
        """
        path = "$.concurrency.key"
        try:
            rendered = self.key.render({"input": value, "steps": {}, "context": {}})
        except ExpressionError as exc:
            raise InputError(f"concurrency key of {definition}: {exc}", path=path) from exc
        if rendered is None or isinstance(rendered, dict | list):
            shown = json.dumps(rendered)[:60]
            raise InputError(
                f"concurrency key of {definition}: {self.key.source!r} gives {shown} for this"
                " input, not a string, number or boolean",
                path=path,
            )
        key = rendered if isinstance(rendered, str) else json.dumps(rendered)
        if len(key) > MAX_KEY_LENGTH:
            raise InputError(
                f"concurrency key of {definition} is {len(key)} characters, more than"
                f" {MAX_KEY_LENGTH}",
                path=path,
            )
        return key


def build_concurrency(doc: dict[str, Any]) -> Concurrency | None:
    """The ``concurrency:`` of a validated document, or None."""
    raw = doc.get("concurrency")
    if raw is None:
        return None
    return Concurrency(
        key=compile_template(raw["key"], path="$.concurrency.key"),
        max_active=int(raw.get("max_active", 1)),
        on_conflict=raw.get("on_conflict", "queue"),
    )


def concurrency_problems(raw: Any) -> list[Problem]:
    """Problems of ``concurrency.key``: its syntax, and reads other than the input.

    The key is rendered at submit, before any step ran.
    """
    if not isinstance(raw, dict) or "key" not in raw:
        return []
    return reads_only(
        ("concurrency", "key"),
        raw["key"],
        ("input",),
        "a concurrency key is rendered at submit, so its expressions read only the input",
    )
