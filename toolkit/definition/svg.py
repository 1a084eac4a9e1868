"""Draw a workflow definition as SVG, each step coloured by what happened to it in a task.

The TaskBrowser's detail pane shows a task's path this way; ``svg(definition)`` without
statuses is the plain drawing. The SVG is made here, in Python: no JavaScript, nothing
fetched, so it shows wherever HTML does (a notebook opened offline, a saved page).

The layout is a simple layered one: each step sits in the layer of its longest path from the
start (edges that loop back are left out of that count), steps in a layer are ordered to
cross few edges, an edge over several layers bends through the layers between, and an edge
back up (a loop) runs down the right-hand side. ``catch`` edges are dashed. A parallel or
map step is one node, labelled with its kind and its number of branches; its branches are
not drawn (the Mermaid drawing, `toolkit.definition.diagram`, shows them).

Like the Mermaid drawing this module reads steps by class name and attributes, through
`toolkit.definition.walk`, and imports no other area.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import re
import types
from collections.abc import Mapping, Sequence

from toolkit.counts import counted
from toolkit.definition.walk import Graph, branches, edges, label_text, step_kind
from toolkit.lifecycle import StepStatus

__all__ = ["STATUS_COLOURS", "svg"]

#: The fill, outline and text colour of a step of each status.
STATUS_COLOURS: Mapping[StepStatus, tuple[str, str, str]] = types.MappingProxyType(
    {
        StepStatus.DONE: ("#e8f5e9", "#2e7d32", "#1b5e20"),
        StepStatus.CURRENT: ("#e3f2fd", "#1565c0", "#0d47a1"),
        StepStatus.FAILED: ("#ffebee", "#c62828", "#b71c1c"),
        StepStatus.WAITING: ("#fff3e0", "#ef6c00", "#e65100"),
        StepStatus.COMPENSATED: ("#f3e5f5", "#7b1fa2", "#4a148c"),
        StepStatus.NOT_REACHED: ("#f5f5f5", "#bdbdbd", "#9e9e9e"),
    }
)
#: The colours of a step in the plain drawing (no statuses).
_PLAIN = ("#fafafa", "#546e7a", "#263238")
#: The start and end markers, and the edges.
_MARKER = ("#eceff1", "#78909c", "#37474f")
_EDGE = "#78909c"

_NODE_W, _NODE_H = 168, 38  # a step, pixels
_MARK_W, _MARK_H = 120, 22  # the start and end markers
_DUMMY_W = 10  # where an edge crosses a layer
_GAP_X, _GAP_Y = 24, 36
_MARGIN = 10
_FONT = "font-family='sans-serif'"
#: Characters XML 1.0 does not allow (a label could hold them; the drawing drops them).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclasses.dataclass
class _Node:
    """A box of the drawing: a step, the start or end marker, or a bend of a long edge."""

    step: str | None  # the step id; None for a marker or a bend
    title: str
    subtitle: str
    kind: str  # the step kind, "start", "end" or "bend"
    width: float
    height: float
    layer: int = 0
    x: float = 0.0  # the centre
    y: float = 0.0  # the centre

    @property
    def top(self) -> float:
        return self.y - self.height / 2

    @property
    def bottom(self) -> float:
        return self.y + self.height / 2

    @property
    def right(self) -> float:
        return self.x + self.width / 2


@dataclasses.dataclass(frozen=True)
class _Link:
    """An edge between two nodes (indexes into the node list)."""

    source: int
    target: int
    label: str
    dashed: bool


def _esc(text: str) -> str:
    """Text (or an attribute value) safe in the SVG's XML."""
    return html.escape(_NOT_XML.sub("", text), quote=True)


def _subtitle(step: object) -> str:
    kind = step_kind(step)
    if kind == "effect":
        return f"effect · {getattr(step, 'handler', '?')}"
    if kind == "workflow":
        return f"workflow · {getattr(step, 'workflow', '?')}"
    if kind == "parallel":
        return f"parallel · {counted(len(branches(step)), 'branch', 'branches')}"
    if kind == "map":
        return "map · each item"
    return kind


def _graph(definition: Graph) -> tuple[list[_Node], list[_Link]]:
    """The nodes (the start marker first, the steps in document order, the end) and edges."""
    start = f"{definition.name} v{definition.version}"
    wide = min(max(_MARK_W, 6.5 * len(start) + 16), _NODE_W)
    nodes = [_Node(None, start, "", "start", wide, _MARK_H)]
    index: dict[str, int] = {}
    for step_id, step in definition.steps.items():
        index[step_id] = len(nodes)
        nodes.append(_Node(step_id, step_id, _subtitle(step), step_kind(step), _NODE_W, _NODE_H))
    links = [_Link(0, index[definition.start], "", False)] if definition.start in index else []
    end: int | None = None
    for step_id, step in definition.steps.items():
        for edge in edges(step):
            if edge.target is None:
                if end is None:
                    end = len(nodes)
                    nodes.append(_Node(None, "succeeded", "", "end", _MARK_W, _MARK_H))
                target = end
            elif edge.target in index:
                target = index[edge.target]
            else:
                continue  # an unknown target; validation reports it
            links.append(_Link(index[step_id], target, edge.label, edge.dashed))
    return nodes, links


def _back_links(count: int, links: Sequence[_Link]) -> tuple[set[int], list[int]]:
    """The links that close a loop (found depth first from the start), and a finishing order.

    Returns:
        ``(back, finished)``: the indexes of the back links, and the nodes in the order the
        search finished them (reversed, a topological order of the other links).
    """
    out: list[list[int]] = [[] for _ in range(count)]
    for number, link in enumerate(links):
        out[link.source].append(number)
    seen = [0] * count  # 0 not yet, 1 on the search's path, 2 finished
    back: set[int] = set()
    finished: list[int] = []
    for root in range(count):  # the start first; then steps no edge reaches (on_timeout)
        if seen[root]:
            continue
        seen[root] = 1
        path = [(root, iter(out[root]))]
        while path:
            node, rest = path[-1]
            for number in rest:
                target = links[number].target
                if seen[target] == 1:
                    back.add(number)
                elif seen[target] == 0:
                    seen[target] = 1
                    path.append((target, iter(out[target])))
                    break
            else:
                seen[node] = 2
                finished.append(node)
                path.pop()
    return back, finished


class _Layout:
    """Layers, order and positions of a graph's nodes, and the route of each edge.

    Nodes are numbered by their place in ``nodes``; the bends of long edges are added to it.
    """

    def __init__(self, nodes: list[_Node], links: list[_Link]) -> None:
        self.nodes = nodes
        self.links = links
        self.back, finished = _back_links(len(nodes), links)
        for n in reversed(finished):  # longest path from the start, loops left out
            for number, link in enumerate(links):
                if link.source == n and number not in self.back:
                    target = nodes[link.target]
                    target.layer = max(target.layer, nodes[n].layer + 1)
        deepest = max(node.layer for node in nodes if node.kind != "end")
        for node in nodes:
            if node.kind == "end":  # the end at the bottom
                node.layer = deepest + 1
        # Each edge's route from its upper end to its lower one (a loop's runs backwards),
        # through a bend in each layer between, which the layer makes room for.
        self.routes: dict[int, list[int]] = {}
        for number, link in enumerate(links):
            upper, lower = link.source, link.target
            if number in self.back:
                upper, lower = lower, upper
            route = [upper]
            for layer in range(nodes[upper].layer + 1, nodes[lower].layer):
                nodes.append(_Node(None, "", "", "bend", _DUMMY_W, _NODE_H, layer))
                route.append(len(nodes) - 1)
            self.routes[number] = [*route, lower] if lower != upper else [upper]
        self.layers: list[list[int]] = [[] for _ in range(max(n.layer for n in nodes) + 1)]
        for n, node in enumerate(nodes):
            self.layers[node.layer].append(n)
        self.above: dict[int, list[int]] = {n: [] for n in range(len(nodes))}
        self.below: dict[int, list[int]] = {n: [] for n in range(len(nodes))}
        for route in self.routes.values():
            for upper, lower in itertools.pairwise(route):
                self.above[lower].append(upper)
                self.below[upper].append(lower)
        self._order()
        self._place()

    def _order(self) -> None:
        """Order each layer by the mean position of its neighbours, sweeping down and up."""
        position = {n: i for layer in self.layers for i, n in enumerate(layer)}
        for sweep in range(4):
            down = sweep % 2 == 0
            near = self.above if down else self.below
            numbers = range(1, len(self.layers)) if down else range(len(self.layers) - 2, -1, -1)
            for number in numbers:
                keys: dict[int, tuple[float, int]] = {}
                for n in self.layers[number]:
                    found = [position[m] for m in near[n]]
                    keys[n] = (sum(found) / len(found) if found else position[n], position[n])
                layer = sorted(self.layers[number], key=keys.__getitem__)
                self.layers[number] = layer
                position.update({n: i for i, n in enumerate(layer)})

    def _place(self) -> None:
        """Centre each node under its neighbours above, as far as the layer's order allows."""
        nodes = self.nodes
        for number, layer in enumerate(self.layers):
            wanted = []
            for n in layer:
                above = [nodes[m].x for m in self.above[n]]
                wanted.append(sum(above) / len(above) if above and number else 0.0)
            left: float | None = None
            for n, x in zip(layer, wanted, strict=True):
                half = nodes[n].width / 2
                nodes[n].x = x if left is None else max(x, left + _GAP_X + half)
                left = nodes[n].x + half
            # Pushed right to make room: move the layer back, as near as it can be on average.
            drift = sum(nodes[n].x - x for n, x in zip(layer, wanted, strict=True)) / len(layer)
            for n in layer:
                nodes[n].x -= drift
                nodes[n].y = _MARGIN + number * (_NODE_H + _GAP_Y) + _NODE_H / 2
        shift = _MARGIN - min(node.x - node.width / 2 for node in nodes)
        for node in nodes:
            node.x += shift

    @property
    def right(self) -> float:
        """The right edge of the nodes."""
        return max(node.right for node in self.nodes)

    @property
    def bottom(self) -> float:
        """The bottom edge of the nodes."""
        return max(node.bottom for node in self.nodes)


def _arrow(points: Sequence[tuple[float, float]], colour: str) -> str:
    """An arrowhead at the end of a polyline."""
    (x1, y1), (x2, y2) = points[-2], points[-1]
    length = max(((x2 - x1) ** 2 + (y2 - y1) ** 2) ** 0.5, 1e-9)
    dx, dy = (x2 - x1) / length, (y2 - y1) / length
    back_x, back_y = x2 - 8 * dx, y2 - 8 * dy
    corners = [(x2, y2), (back_x - 4 * dy, back_y + 4 * dx), (back_x + 4 * dy, back_y - 4 * dx)]
    return f"<polygon points='{_points(corners)}' fill='{colour}'/>"


def _points(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _edge_points(layout: _Layout, number: int, offset: float) -> list[tuple[float, float]]:
    """The polyline of an edge, from its source to its target.

    Down from the bottom of the source to the top of the target; for a loop, up from the top
    of the source to the bottom of the target; for a step going to itself, round its right.
    """
    link, nodes = layout.links[number], layout.nodes
    source, target = nodes[link.source], nodes[link.target]
    route = [nodes[n] for n in layout.routes[number]]
    bends = [(bend.x, bend.y) for bend in route[1:-1]]
    if link.source == link.target:
        x, y = source.right, source.y
        return [(x, y - 7), (x + 14, y - 7), (x + 14, y + 7), (x, y + 7)]
    if number in layout.back:
        aside = source.width * 0.3 + offset
        return [(source.x + aside, source.top), *reversed(bends), (target.x + aside, target.bottom)]
    return [(source.x + offset, source.bottom), *bends, (target.x + offset, target.top)]


def _edge_parts(layout: _Layout) -> tuple[list[str], float]:
    """The SVG of every edge, and the rightmost point it takes (labels included)."""
    nodes = layout.nodes
    parts: list[str] = []
    pairs: dict[tuple[int, int], list[int]] = {}
    for number, link in enumerate(layout.links):
        pairs.setdefault((link.source, link.target), []).append(number)
    right = layout.right
    for number, link in enumerate(layout.links):
        source, target = nodes[link.source], nodes[link.target]
        twins = pairs[(link.source, link.target)]
        offset = (twins.index(number) - (len(twins) - 1) / 2) * 10  # side by side
        points = _edge_points(layout, number, offset)
        dash = " stroke-dasharray='5 3'" if link.dashed else ""
        ends = f"{_esc(source.step or source.kind)} to {_esc(target.step or target.kind)}"
        parts.append(
            f"<g class='toolkit-edge'><title>{ends}"
            + (f": {_esc(link.label)}" if link.label else "")
            + f"</title><polyline points='{_points(points)}' fill='none' stroke='{_EDGE}'"
            f" stroke-width='1.3'{dash}/>{_arrow(points, _EDGE)}"
        )
        if link.label:
            label = label_text(link.label, 18)
            if link.source == link.target:
                x, y, anchor = points[1][0] + 3, source.y + 3, "start"
                right = max(right, x + 6 * len(label))
            else:  # most of the way along the first stretch, where edges have spread out
                (x1, y1), (x2, y2) = points[0], points[1]
                x, y, anchor = x1 + (x2 - x1) * 0.6, y1 + (y2 - y1) * 0.6, "middle"
                y += 11 * twins.index(number)  # twins' labels one under the other
                right = max(right, x + 3 * len(label))
            text = f"<text x='{x:.1f}' y='{y:.1f}' font-size='10' text-anchor='{anchor}'"
            parts.append(  # a white halo under the text keeps it readable over a line
                f"{text} fill='#ffffff' stroke='#ffffff' stroke-width='3'>{_esc(label)}</text>"
                f"{text} fill='#455a64'>{_esc(label)}</text>"
            )
        parts.append("</g>")
    return parts, right + 14  # room for a step's loop to itself


def _node_part(node: _Node, status: StepStatus | None, note: str | None) -> str:
    """The SVG of a step or a marker (a bend draws nothing)."""
    if node.kind == "bend":
        return ""
    left, top = node.x - node.width / 2, node.top
    if node.step is None:  # the start or end marker
        fill, stroke, ink = _MARKER
        return (
            f"<g class='toolkit-marker'><rect x='{left:.1f}' y='{top:.1f}'"
            f" width='{node.width}' height='{node.height}' rx='{node.height / 2}'"
            f" fill='{fill}' stroke='{stroke}'/><text x='{node.x:.1f}' y='{node.y + 4:.1f}'"
            f" font-size='11' text-anchor='middle' fill='{ink}'>"
            f"{_esc(label_text(node.title, 24))}</text></g>"
        )
    fill, stroke, ink = STATUS_COLOURS[status] if status is not None else _PLAIN
    width = 3 if status in (StepStatus.CURRENT, StepStatus.WAITING) else 1.5
    rounded = node.height / 2 if node.kind in ("succeed", "fail") else 5
    tip = f"{node.step} ({node.kind})"
    if status is not None:
        tip += f": {str(status).replace('_', ' ')}"
    tip += f" — {note}" if note else ""
    data = f" data-status='{_esc(status)}'" if status is not None else ""
    return (
        f"<g class='toolkit-step' data-step='{_esc(node.step)}'{data}>"
        f"<title>{_esc(tip)}</title>"
        f"<rect x='{left:.1f}' y='{top:.1f}' width='{node.width}' height='{node.height}'"
        f" rx='{rounded}' fill='{fill}' stroke='{stroke}' stroke-width='{width}'/>"
        f"<text x='{node.x:.1f}' y='{top + 15:.1f}' font-size='12' font-weight='bold'"
        f" text-anchor='middle' fill='{ink}'>{_esc(label_text(node.title, 22))}</text>"
        f"<text x='{node.x:.1f}' y='{top + 30:.1f}' font-size='10' text-anchor='middle'"
        f" fill='{ink}'>{_esc(label_text(node.subtitle, 28))}</text></g>"
    )


def _legend(top: float, width: float) -> tuple[list[str], float]:
    """The colour of each status, in rows that fit ``width``; and the bottom of the rows."""
    parts = ["<g class='toolkit-legend'>"]
    x, y = float(_MARGIN), top
    for status, (fill, stroke, _) in STATUS_COLOURS.items():
        label = str(status).replace("_", " ")
        size = 12 + 5 + 6.5 * len(label) + 14
        if x > _MARGIN and x + size > width - _MARGIN:
            x, y = float(_MARGIN), y + 18
        parts.append(
            f"<rect x='{x:.1f}' y='{y:.1f}' width='12' height='12' rx='2' fill='{fill}'"
            f" stroke='{stroke}' stroke-width='1.5'/><text x='{x + 17:.1f}' y='{y + 10:.1f}'"
            f" font-size='11' fill='#37474f'>{_esc(label)}</text>"
        )
        x += size
    parts.append("</g>")
    return parts, y + 12


def svg(
    definition: Graph,
    statuses: Mapping[str, StepStatus | str] | None = None,
    notes: Mapping[str, str] | None = None,
) -> str:
    """The definition's graph as an SVG document, its steps coloured by ``statuses``.

    Args:
        definition: a `toolkit.WorkflowDefinition` (or anything with ``name``,
            ``version``, ``start`` and ``steps``).
        statuses: step id to what happened to it in a task (a `toolkit.lifecycle.StepStatus`
            or its value), as `toolkit.history.task_path.task_path` says; a step it does not
            name is ``not_reached``. None draws the plain graph, without colours or legend.
        notes: step id to a line of text shown as the step's tooltip (why it has its
            status), or None.

    Returns:
        An ``<svg>`` element (well-formed XML, UTF-8 text, no external references) with one
        ``<g class="toolkit-step" data-step="ID" data-status="STATUS">`` per step; with
        statuses, a legend of the colours below the graph.

    Raises:
        ValueError: a status that is no `StepStatus`.
    """
    marks = None
    if statuses is not None:
        marks = {step: StepStatus(value) for step, value in statuses.items()}
    nodes, links = _graph(definition)
    layout = _Layout(nodes, links)
    edge_parts, right = _edge_parts(layout)
    width = right + _MARGIN
    body = [
        _node_part(
            node,
            None if marks is None else marks.get(node.step or "", StepStatus.NOT_REACHED),
            (notes or {}).get(node.step or ""),
        )
        for node in nodes
    ]
    height = layout.bottom + _MARGIN
    legend: list[str] = []
    if marks is not None:
        width = max(width, 330.0)
        legend, bottom = _legend(height + 4, width)
        height = bottom + _MARGIN
    name = f"{definition.name} v{definition.version}"
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}'"
        f" viewBox='0 0 {width:.0f} {height:.0f}' role='img' {_FONT}"
        f" aria-label='{_esc(name)}'><title>{_esc(name)}</title>"
        + "".join(edge_parts + body + legend)
        + "</svg>"
    )
