"""How a drawing reads a definition's graph: step kinds, the edges out of a step, branches.

The Mermaid drawing (`toolkit.definition.diagram`) and the SVG drawing
(`toolkit.definition.svg`) both walk a graph through these functions, so they agree on
what a step's kind is and where it may go next. They read step objects by class name and
attributes only: a step kind they do not know is a plain node labelled with its kind.
(The load-time checks of `toolkit.definition.graph` walk the raw document instead.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from toolkit.durations import format_duration

_KINDS = {
    "EffectStep": "effect",
    "ChoiceStep": "choice",
    "SucceedStep": "succeed",
    "FailStep": "fail",
    "WaitStep": "wait",
    "ParallelStep": "parallel",
    "MapStep": "map",
    "WorkflowStep": "workflow",
    "DistributedMapStep": "distributed map",
}


class Graph(Protocol):
    """What a drawing needs of a definition (a `toolkit.WorkflowDefinition` has it)."""

    @property
    def name(self) -> str:
        """Workflow name."""

    @property
    def version(self) -> int:
        """Workflow version."""

    @property
    def start(self) -> str:
        """Id of the first step."""

    @property
    def steps(self) -> Mapping[str, Any]:
        """Steps by id."""


class Edge(NamedTuple):
    """One edge out of a step.

    Attributes:
        target: the step it goes to; None is the end of the graph (the workflow succeeds,
            or the branch ends).
        label: the condition of a choice rule, ``default``, a ``wait: {any}`` event, or
            ``catch ERRORS``; ``""`` for a plain ``next``.
        dashed: whether it is a ``catch`` rule (drawn dashed).
    """

    target: str | None
    label: str
    dashed: bool


def step_kind(step: object) -> str:
    """The kind of a step as written in YAML (``effect``, ``choice`` ...).

    A step class this module does not know gives its class name in lower case, without
    ``Step``.
    """
    name = type(step).__name__
    return _KINDS.get(name, name.removesuffix("Step").lower() or name)


def source(template: object) -> object:
    """A template's source text (``${ ... }``), or the value itself when it has none."""
    return getattr(template, "source", template)


def label_text(value: object, limit: int) -> str:
    """A label as a drawing shows it, not escaped (each drawing escapes for its format).

    Args:
        value: the text (str() of it); an expression loses its ``${ }``.
        limit: most characters; longer text is cut and ends with ``…``.
    """
    text = str(value)
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1].strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


_PLAIN_ERROR = re.compile(r"\*|[A-Za-z0-9_.-]+")


def error_label(names: Iterable[object]) -> str:
    """Error names as a drawing shows them, joined by ``, ``.

    A name of letters, digits, ``_``, ``.`` and ``-`` (``OutOfStock``, ``missing-order-id``)
    and ``*`` are shown as they are; any other is quoted as JSON (``"Job Failed"``), so that
    a name holding a space or a comma still reads as one name.
    """
    return ", ".join(
        name if _PLAIN_ERROR.fullmatch(name) else json.dumps(name, ensure_ascii=False)
        for name in map(str, names)
    )


def branches(step: object) -> Mapping[str, Any]:
    """The branch graphs of a parallel or map step by name (a map's one is ``each item``).

    Returns:
        Name to branch (an object with ``start`` and ``steps``); empty for other kinds.
    """
    kind = step_kind(step)
    if kind == "parallel":
        found: Mapping[str, Any] = getattr(step, "branches", {}) or {}
        return found
    branch = getattr(step, "branch", None) if kind == "map" else None
    return {"each item": branch} if branch is not None else {}


def _event_label(event: Any) -> str:
    """The label of a ``wait: {any}`` event's edge: its signal, event, duration or moment."""
    if getattr(event, "signal", None):
        return f"signal {event.signal}"
    if getattr(event, "event", None):
        return f"event {event.event}"
    if getattr(event, "duration", None):
        return f"after {format_duration(event.duration)}"
    return f"at {source(getattr(event, 'until', None))}"


def edges(step: Any) -> Iterator[Edge]:
    """Each edge out of a step, in the order the step declares them.

    Choice rules then ``default``; a ``wait: {any}`` step's events; else its ``next``
    (succeed and fail steps have none); then its ``catch`` rules, dashed.

    Args:
        step: a step object of `toolkit.definition.model` (or one with the same attributes).

    Yields:
        `Edge` values; a target may name no step of the graph (validation reports that).
    """
    kind = step_kind(step)
    if kind == "choice":
        for rule in getattr(step, "choices", ()):
            yield Edge(rule.next, str(source(rule.when)), False)
        default = getattr(step, "default", None)
        if default is not None:
            yield Edge(default, "default", False)
    elif kind == "wait" and getattr(step, "any", None):
        for event in step.any:
            yield Edge(event.next, _event_label(event), False)
    elif kind not in ("succeed", "fail"):
        if hasattr(step, "next"):
            yield Edge(step.next, "", False)
    for rule in getattr(step, "catch", ()) or ():
        errors = getattr(rule, "errors", ()) or ("*",)
        yield Edge(rule.next, "catch " + error_label(errors), True)
