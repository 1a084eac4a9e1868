"""A definition's flow control: concurrency key, debounce and throttle (docs/flow-control.md).

- ``concurrency: {key: "${ input.account }", max_active: 1, on_conflict: queue}``: at most
  ``max_active`` live tasks per key value; tasks of one key value (per tenant and definition
  name) take it in submission order and hold it from their admission until they end, through
  their waits and retries (the store enforces it, migration ``0015_concurrency_keys``).
- ``debounce: {key: "${ input.document }", quiet: 5s, max_wait: 1m}``: submits of one key
  value within ``quiet`` of each other start one task, with the last input, once the key is
  quiet (or ``max_wait`` after the first).
- ``throttle: {key: "${ input.customer }", rate: 10/min, excess: delay}``: at most ``rate``
  task starts per key value, the excess delayed (or refused).

Each key is rendered from the input at submit; this module is the declarations and their
checks.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from toolkit.definition.expressions import Template, compile_template
from toolkit.definition.references import reads_only
from toolkit.definition.yaml_source import Problem
from toolkit.durations import MAX_SECONDS, parse_duration, rate_parts
from toolkit.errors import ExpressionError, InputError

#: What a submit does when the key already has ``max_active`` live tasks.
OnConflict = Literal["queue", "skip", "cancel_running", "cancel_newest"]
#: What a throttled submit does past the rate.
Excess = Literal["delay", "refuse"]
#: Longest key value, characters.
MAX_KEY_LENGTH = 256


def render_key(template: Template, value: Any, what: str, path: str) -> str:
    """The key value ``template`` renders from input ``value``.

    Args:
        template: the key expression.
        value: the task input.
        what: names the key in messages (``"concurrency key of keyed v1"``).
        path: where the key is declared (``"$.concurrency.key"``).

    Raises:
        InputError: the expression fails, gives null, an object or a list, or a key longer
            than `MAX_KEY_LENGTH`; ``path`` is the given one.
    """
    try:
        rendered = template.render({"input": value, "steps": {}, "context": {}})
    except ExpressionError as exc:
        raise InputError(f"{what}: {exc}", path=path) from exc
    if rendered is None or isinstance(rendered, dict | list):
        shown = json.dumps(rendered)[:60]
        raise InputError(
            f"{what}: {template.source!r} gives {shown} for this input, not a string, number"
            " or boolean",
            path=path,
        )
    key = rendered if isinstance(rendered, str) else json.dumps(rendered)
    if len(key) > MAX_KEY_LENGTH:
        raise InputError(f"{what} is {len(key)} characters, more than {MAX_KEY_LENGTH}", path=path)
    return key


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
            InputError: see `render_key`; ``path`` is ``$.concurrency.key``.
        """
        return render_key(self.key, value, f"concurrency key of {definition}", "$.concurrency.key")


@dataclasses.dataclass(frozen=True)
class Debounce:
    """The ``debounce:`` of a definition.

    Attributes:
        key: renders the key value from ``{"input": ...}``.
        quiet: seconds without a submit of the key before its task starts.
        max_wait: most seconds from the first submit of a burst to its start; None: none.
    """

    key: Template
    quiet: float
    max_wait: float | None = None

    def key_of(self, value: Any, definition: str) -> str:
        """The key value of a task of input ``value`` (see `render_key`)."""
        return render_key(self.key, value, f"debounce key of {definition}", "$.debounce.key")


@dataclasses.dataclass(frozen=True)
class Throttle:
    """The ``throttle:`` of a definition: a rate of task starts per key value.

    Attributes:
        key: renders the key value from ``{"input": ...}``.
        calls: starts allowed per ``period`` (a burst of as many may start at once).
        period: seconds.
        excess: past the rate, ``delay`` the start (waiting, reason ``start``) or
            ``refuse`` the submit (``Throttled``, with the seconds until a start is free).
    """

    key: Template
    calls: float
    period: float
    excess: Excess = "delay"

    def key_of(self, value: Any, definition: str) -> str:
        """The key value of a task of input ``value`` (see `render_key`)."""
        return render_key(self.key, value, f"throttle key of {definition}", "$.throttle.key")


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


def build_debounce(doc: dict[str, Any]) -> Debounce | None:
    """The ``debounce:`` of a validated document, or None."""
    raw = doc.get("debounce")
    if raw is None:
        return None
    return Debounce(
        key=compile_template(raw["key"], path="$.debounce.key"),
        quiet=parse_duration(raw["quiet"]),
        max_wait=parse_duration(raw["max_wait"]) if "max_wait" in raw else None,
    )


def build_throttle(doc: dict[str, Any]) -> Throttle | None:
    """The ``throttle:`` of a validated document, or None."""
    raw = doc.get("throttle")
    if raw is None:
        return None
    parts = rate_parts(raw["rate"])
    assert parts is not None, "the schema checks the rate"
    return Throttle(
        key=compile_template(raw["key"], path="$.throttle.key"),
        calls=parts[0],
        period=parts[1],
        excess=raw.get("excess", "delay"),
    )


def flow_control_problems(doc: dict[str, Any]) -> list[Problem]:
    """Problems of ``concurrency``, ``debounce`` and ``throttle``.

    Their keys are rendered at submit, before any step ran: their expressions read only the
    input. A debounced task is one that has not started, whose input a later submit
    replaces: it cannot also wait for a concurrency key or a throttle's start.
    """
    problems = []
    for field in ("concurrency", "debounce", "throttle"):
        raw = doc.get(field)
        if not isinstance(raw, dict) or "key" not in raw:
            continue
        problems += reads_only(
            (field, "key"),
            raw["key"],
            ("input",),
            f"a {field} key is rendered at submit, so its expressions read only the input",
        )
        if field == "throttle" and isinstance(raw.get("rate"), str):
            parts = rate_parts(raw["rate"])
            if parts is None or parts[0] < 1:
                problems.append(Problem(("throttle", "rate"), (
                    f"rate {raw['rate']!r} is not a rate like '10/min', '5/s' or '100/h' of at"
                    " least one start"
                )))  # fmt: skip
    debounce = doc.get("debounce")
    if isinstance(debounce, dict):
        for field in ("quiet", "max_wait"):
            if field not in debounce:
                continue
            try:
                seconds = parse_duration(debounce[field])
            except ValueError as exc:
                problems.append(Problem(("debounce", field), str(exc)))
                continue
            if not 0 < seconds <= MAX_SECONDS:
                problems.append(Problem(
                    ("debounce", field), f"{field} must be greater than zero and at most 100 years"
                ))  # fmt: skip
        for other in ("concurrency", "throttle"):
            if other in doc:
                problems.append(Problem(("debounce",), (
                    f"debounce cannot be combined with {other} yet: a debounced task has not "
                    "started, and a later submit replaces its input"
                )))  # fmt: skip
    return problems
