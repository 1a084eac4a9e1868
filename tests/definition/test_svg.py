"""Definitions draw themselves as SVG (``toolkit.definition.svg``): well-formed XML, one node
per step in layers from the start, dashed catch edges, loops, each status in its colour, and
every label escaped. (The task paths it colours: ``tests/history/test_task_path.py``.)"""

from __future__ import annotations

import itertools
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.definition import SucceedStep, load_definition, parse_definition
from toolkit.definition.expressions import compile_template
from toolkit.definition.svg import STATUS_COLOURS, svg
from toolkit.definition.walk import edges
from toolkit.lifecycle import StepStatus

REPO = Path(__file__).resolve().parents[2]
NS = {"s": "http://www.w3.org/2000/svg"}
EXAMPLES = sorted((REPO / "definitions").glob("*.yaml"))


def parsed(text: str) -> ET.Element:
    root = ET.fromstring(text)  # raises on anything but well-formed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def step_nodes(root: ET.Element) -> dict[str, ET.Element]:
    nodes = root.findall(".//s:g[@class='toolkit-step']", NS)
    found = {node.get("data-step"): node for node in nodes}
    assert len(found) == len(nodes), "one node per step"
    return found  # type: ignore[return-value]


def box(node: ET.Element) -> tuple[float, float, float, float]:
    rect = node.find("s:rect", NS)
    assert rect is not None
    x, y = float(rect.get("x", 0)), float(rect.get("y", 0))
    return x, y, x + float(rect.get("width", 0)), y + float(rect.get("height", 0))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_draws_one_node_per_step_none_overlapping(path: Path) -> None:
    d = load_definition(path)
    root = parsed(svg(d))
    nodes = step_nodes(root)
    assert list(nodes) == list(d.steps)
    # The plain drawing: no statuses, no legend, nothing fetched, no script.
    assert all(node.get("data-status") is None for node in nodes.values())
    assert root.find(".//s:g[@class='toolkit-legend']", NS) is None
    assert root.find(".//s:script", NS) is None
    text = svg(d)
    assert "href" not in text and "<style" not in text
    boxes = [box(node) for node in nodes.values()]
    for (a, b) in itertools.combinations(boxes, 2):
        apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
        assert apart, f"{path.stem}: nodes overlap: {a} {b}"
    # Inside the drawing's size.
    width, height = float(root.get("width", 0)), float(root.get("height", 0))
    assert all(0 <= x1 and x2 <= width and 0 <= y1 and y2 <= height for x1, y1, x2, y2 in boxes)
    # One line per edge the Mermaid drawing walks too (plus the start's), catch edges dashed.
    walked = [e for step in d.steps.values() for e in edges(step)]
    lines = root.findall(".//s:g[@class='toolkit-edge']/s:polyline", NS)
    assert len(lines) == len(walked) + 1
    dashed = [line for line in lines if line.get("stroke-dasharray")]
    assert len(dashed) == sum(1 for e in walked if e.dashed)


def test_steps_sit_in_layers_by_their_longest_path_from_the_start() -> None:
    nodes = step_nodes(parsed(svg(definition(THREE_STEPS))))
    top = {step: box(node)[1] for step, node in nodes.items()}
    assert top["first"] < top["second"] < top["route"] < top["zero"] == top["third"]
    labels = {step: [t.text for t in node.findall("s:text", NS)] for step, node in nodes.items()}
    assert labels["first"] == ["first", "effect · count.work"]
    assert labels["route"] == ["route", "choice"] and labels["zero"] == ["zero", "succeed"]


def test_loops_parallel_steps_and_long_labels() -> None:
    poll = load_definition(REPO / "definitions" / "poll-loop.yaml")
    root = parsed(svg(poll))
    nodes = step_nodes(root)
    # `pause` goes back up to `check`: the loop's line ends at the bottom of `check`.
    titles = [g.findtext("s:title", namespaces=NS) for g in root.iter(f"{{{NS['s']}}}g")]
    assert "pause to check" in titles
    assert box(nodes["pause"])[1] > box(nodes["check"])[1]
    race = load_definition(REPO / "definitions" / "research-race.yaml")
    node = step_nodes(parsed(svg(race)))["research"]
    assert [t.text for t in node.findall("s:text", NS)][1] == "parallel · 2 branches"
    long = parse_definition(
        "name: long\nversion: 1\nstart: a_step_with_a_very_long_name_indeed\nsteps:\n"
        "  a_step_with_a_very_long_name_indeed: {succeed: {}}\n",
        source="<long>",
    )
    node = step_nodes(parsed(svg(long)))["a_step_with_a_very_long_name_indeed"]
    shown = node.findall("s:text", NS)[0].text or ""
    assert shown.endswith("…") and len(shown) <= 22
    assert "a_step_with_a_very_long_name_indeed" in (node.findtext("s:title", namespaces=NS) or "")


def test_each_status_has_its_colour_and_the_legend_says_which() -> None:
    d = load_definition(REPO / "definitions" / "order-saga-compensated.yaml")
    every = list(StepStatus)
    given = {step: every[i % len(every)] for i, step in enumerate(list(d.steps)[:-1])}
    root = parsed(svg(d, given, {"reserve": "reserve#1 completed"}))
    nodes = step_nodes(root)
    for step, node in nodes.items():
        status = given.get(step, StepStatus.NOT_REACHED)  # a step not given: not reached
        assert node.get("data-status") == status
        fill, stroke, _ = STATUS_COLOURS[status]
        rect = node.find("s:rect", NS)
        assert rect is not None and (rect.get("fill"), rect.get("stroke")) == (fill, stroke)
    assert nodes["reserve"].findtext("s:title", namespaces=NS) == (
        "reserve (effect): done — reserve#1 completed"
    )
    assert len({STATUS_COLOURS[s][0] for s in StepStatus}) == len(StepStatus)  # all differ
    legend = root.find(".//s:g[@class='toolkit-legend']", NS)
    assert legend is not None
    assert [t.text for t in legend.findall("s:text", NS)] == [
        "done", "current", "failed", "waiting", "compensated", "not reached",
    ]  # fmt: skip
    swatches = [r.get("fill") for r in legend.findall("s:rect", NS)]
    assert swatches == [STATUS_COLOURS[s][0] for s in StepStatus]
    with pytest.raises(ValueError):
        svg(d, {"reserve": "finished"})


def test_labels_are_escaped() -> None:
    # A condition with < > && (JMESPath) on a choice's edge, and a graph whose names have
    # what XML must escape (the drawing takes anything with name, version, start, steps).
    d = parse_definition(
        """
name: escapes
version: 1
input: {type: object}
start: route
steps:
  route:
    choice:
      - when: "${ input.n < `3` && input.m > `1` }"
        next: small
    default: big
  small: {succeed: {output: small}}
  big: {succeed: {output: big}}
""",
        source="<escapes>",
    )
    text = svg(d)
    root = parsed(text)
    labels = [t.text for t in root.iter(f"{{{NS['s']}}}text")]
    assert "input.n < `3` && …" in labels  # cut short on the edge
    titles = [t.text for t in root.iter(f"{{{NS['s']}}}title")]
    assert "route to small: ${ input.n < `3` && input.m > `1` }" in titles  # whole in its tip
    assert "input.n &lt; `3` &amp;&amp;" in text
    ends = SucceedStep(id="end", output=compile_template(None))
    odd = types.SimpleNamespace(
        name="a<b>&'\"c", version=2, start="x<&>y\x01", steps={"x<&>y\x01": ends},
    )
    root = parsed(svg(odd, {"x<&>y\x01": "done"}, {"x<&>y\x01": "why: <&>"}))
    node = root.find(".//s:g[@class='toolkit-step']", NS)
    assert node is not None and node.get("data-step") == "x<&>y"  # no control character
    assert node.findtext("s:text", namespaces=NS) == "x<&>y"
    assert node.findtext("s:title", namespaces=NS) == "x<&>y (succeed): done — why: <&>"
    assert root.get("aria-label") == "a<b>&'\"c v2"
