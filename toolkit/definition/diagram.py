"""Draw a workflow definition as a Mermaid flowchart (notebooks, docs, ``_repr_markdown_``).

The drawing shows every step with its kind: effects with their handler, whether they are
idempotent (a non-idempotent effect is outlined in red: after a crash it goes to
reconciliation) and their retry limit; choices as diamonds with their conditions on the
edges; waits (signal, timer) as hexagons, a wait for the first of several events with an
edge per event; parallel and map steps as boxes around their
branches; child workflows; and the ends. Dashed edges are ``catch`` rules.

This module reads the step objects by their class name and attributes only, through
:mod:`toolkit.definition.walk` (which the SVG drawing, :mod:`toolkit.definition.svg`, shares),
so it draws step kinds it does not know as a plain node labelled with the kind, and it sits
below :mod:`toolkit.definition` in the layers (the definition's ``_repr_markdown_`` calls it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolkit.definition.walk import Graph as Graph
from toolkit.definition.walk import branches, edges, error_label, label_text, source
from toolkit.definition.walk import step_kind as step_kind
from toolkit.durations import format_duration

_CLASSES = (
    "classDef effect fill:#e8f0fe,stroke:#4a6fa5",
    "classDef unsafe fill:#fdecea,stroke:#c62828,stroke-width:2px",
    "classDef choice fill:#fff8e1,stroke:#b8860b",
    "classDef wait fill:#f3e5f5,stroke:#7b1fa2",
    "classDef ok fill:#e8f5e9,stroke:#2e7d32",
    "classDef bad fill:#fbe9e7,stroke:#bf360c",
    "classDef other fill:#eeeeee,stroke:#616161",
)


def _text(value: object, limit: int = 48) -> str:
    """Label text safe inside a quoted Mermaid label."""
    return (
        label_text(value, limit)
        .replace("&", "#38;")
        .replace('"', "#quot;")
        .replace("<", "#60;")
        .replace(">", "#62;")
        .replace("`", "#96;")  # an entity: a bare backtick starts Mermaid's markdown
    )


class _Drawing:
    """Mermaid text of one graph (and its branch subgraphs)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0
        self.end_used = False
        self.fail_used = False

    def node_id(self) -> str:
        self.count += 1
        return f"n{self.count}"

    def graph(
        self, steps: Mapping[str, Any], start: str, indent: str, entry: str, *, top: bool
    ) -> None:
        """Draw ``steps``; ``entry`` is the node that points at the start step.

        Only the task's own graph (``top``) draws the edges of steps without ``next`` to the
        end.
        """
        ids = {step_id: self.node_id() for step_id in steps}
        for step_id, step in steps.items():
            self.node(ids[step_id], step_id, step, indent)
        if start in ids:
            self.lines.append(f"{indent}{entry} --> {ids[start]}")
        for step_id, step in steps.items():
            for target, label, dashed in edges(step):
                if target is None:
                    if not top:
                        continue  # the branch ends there
                    self.end_used = True
                    node: str | None = "wf_end"
                else:
                    node = ids.get(target)
                    if node is None:
                        continue  # an unknown target; validation reports it
                arrow = "-.->" if dashed else "-->"
                text = f'|"{_text(label, 40)}"|' if label else ""
                self.lines.append(f"{indent}{ids[step_id]} {arrow}{text} {node}")

    def node(self, node: str, step_id: str, step: Any, indent: str) -> None:
        kind = step_kind(step)
        title = f"<b>{_text(step_id)}</b>"
        if kind == "effect":
            idempotent = bool(getattr(step, "idempotent", False))
            retry = getattr(getattr(step, "retry", None), "max_attempts", None)
            parts = [title, f"effect {_text(getattr(step, 'handler', '?'))}"]
            parts.append("idempotent" if idempotent else "NOT idempotent: reconcile")
            if retry and retry > 1:
                parts.append(f"retry x{retry}")
            timeout = getattr(step, "timeout", None)
            if timeout:
                parts.append(f"timeout {format_duration(timeout)}")
            label = "<br/>".join(parts)
            css = "effect" if idempotent else "unsafe"
            self.lines.append(f'{indent}{node}["{label}"]:::{css}')
        elif kind == "choice":
            self.lines.append(f'{indent}{node}{{"{title}"}}:::choice')
        elif kind == "succeed":
            self.lines.append(f'{indent}{node}(["{title}<br/>succeed"]):::ok')
        elif kind == "fail":
            error = _text(error_label([getattr(step, "error", "?")]))
            self.lines.append(f'{indent}{node}(["{title}<br/>fail {error}"]):::bad')
        elif kind == "wait":
            self.lines.append(f'{indent}{node}{{{{"{title}<br/>{_wait_text(step)}"}}}}:::wait')
        elif kind == "workflow":
            version = getattr(step, "version", None)
            child = _text(getattr(step, "workflow", "?")) + (f" v{version}" if version else "")
            self.lines.append(f'{indent}{node}[["{title}<br/>child workflow {child}"]]:::other')
        elif kind in ("parallel", "map"):
            self.fanout(node, step_id, step, kind, indent)
        else:
            self.lines.append(f'{indent}{node}["{title}<br/>{_text(kind)}"]:::other')

    def fanout(self, node: str, step_id: str, step: Any, kind: str, indent: str) -> None:
        if kind == "parallel":
            mode = getattr(step, "mode", "all")
            detail = f"parallel, {'first success' if mode == 'first_success' else 'all'}"
        else:
            bound = getattr(step, "max_concurrency", None)
            detail = f"map over {_text(source(getattr(step, 'items', '?')), 30)}"
            detail += f", ≤ {bound} at once" if bound else ""
        reserve = getattr(step, "reserve", None)
        amounts = getattr(reserve, "amounts", None)
        if amounts:
            detail += "<br/>reserves " + ", ".join(f"{k} {v:g}" for k, v in amounts.items())
        self.lines.append(f'{indent}subgraph {node}["{_text(step_id)}: {detail}"]')
        for name, branch in branches(step).items():
            inner = self.node_id()
            self.lines.append(f'{indent}  {inner}(("{_text(name, 20)}"))')
            steps = getattr(branch, "steps", {}) or {}
            start = getattr(branch, "start", "")
            self.graph(steps, start, indent + "  ", inner, top=False)
        self.lines.append(f"{indent}end")


def _wait_text(step: Any) -> str:
    for kind in ("signal", "event"):
        name = getattr(step, kind, None)
        if name:
            timeout = getattr(step, "timeout", None)
            return f"wait {kind} {_text(name)}" + (
                f", timeout {format_duration(timeout)}" if timeout else ""
            )
    duration = getattr(step, "duration", None)
    if duration:
        return f"wait {format_duration(duration)}"
    until = getattr(step, "until", None)
    if until is not None:
        return f"wait until {_text(source(until), 30)}"
    if getattr(step, "any", None):
        return "wait for the first event"
    return "wait"


def mermaid(definition: Graph) -> str:
    """The Mermaid flowchart of a definition.

    Args:
        definition: a `toolkit.WorkflowDefinition` (or anything with ``name``, ``version``,
            ``start`` and ``steps``).

    Returns:
        Mermaid source (``flowchart TD ...``), without a code fence.
    """
    drawing = _Drawing()
    drawing.lines.append("flowchart TD")
    drawing.lines.append(f'  wf_start(("{_text(definition.name)} v{definition.version}"))')
    drawing.graph(definition.steps, definition.start, "  ", "wf_start", top=True)
    if drawing.end_used:
        drawing.lines.append('  wf_end(("succeeded"))')
    drawing.lines.extend(f"  {line}" for line in _CLASSES)
    return "\n".join(drawing.lines)


def markdown(definition: Graph) -> str:
    """A definition as Markdown: a title line and its Mermaid flowchart in a code fence.

    JupyterLab (4.1 or later) and mkdocs-material render the fence as a picture.

    Args:
        definition: a `toolkit.WorkflowDefinition`.

    Returns:
        Markdown text.
    """
    digest = getattr(definition, "digest", "")
    kinds: dict[str, int] = {}
    for step in definition.steps.values():
        kinds[step_kind(step)] = kinds.get(step_kind(step), 0) + 1
    summary = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
    title = f"**{definition.name}** v{definition.version}"
    if digest:
        title += f" · digest `{digest[:12]}`"
    return f"{title} · {summary}\n\n```mermaid\n{mermaid(definition)}\n```\n"
