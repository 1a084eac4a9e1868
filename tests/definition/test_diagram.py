"""Definitions draw themselves: the Mermaid graph of every step kind, wait and catch rule
(``toolkit.definition.diagram``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.definition import load_definition, parse_definition
from toolkit.definition.diagram import markdown, mermaid, step_kind

REPO = Path(__file__).resolve().parents[2]


def test_a_definition_displays_as_a_mermaid_graph() -> None:
    d = definition(THREE_STEPS)
    text = d._repr_markdown_()
    assert text.startswith(f"**three-steps** v1 · digest `{d.digest[:12]}`")
    assert "```mermaid\nflowchart TD\n" in text and text.rstrip().endswith("```")
    body = mermaid(d)
    # Step kinds, idempotency and the choice's condition are visible.
    assert '<b>first</b><br/>effect count.work<br/>idempotent' in body
    assert "NOT idempotent: reconcile" in body and ":::unsafe" in body
    assert '{"<b>route</b>"}:::choice' in body
    # JMESPath's backticks (a literal) stay backticks: a quote would make it a string.
    assert "steps.second.value == #96;0#96;" in body and "'0'" not in body
    assert '-->|"default"|' in body
    assert "wf_end((" in body  # `third` has no next: the workflow succeeds there


def test_waits_catch_rules_and_examples_are_drawn() -> None:
    d = parse_definition(
        """
name: approvals
version: 2
input: {type: object}
start: ask
steps:
  ask:
    wait: {signal: approved, timeout: 2d}
    catch: [{errors: [Timeout], next: give_up}]
    next: pause
  pause: {wait: {duration: 90s}, next: done}
  give_up: {fail: {error: NotApproved, message: "no answer"}}
  done: {succeed: {output: ok}}
""",
        source="<approvals>",
    )
    body = mermaid(d)
    assert "wait signal approved, timeout 2d" in body and "wait 90s" in body
    assert '-.->|"catch Timeout"|' in body
    assert "fail NotApproved" in body
    for path in sorted((REPO / "definitions").glob("*.yaml")):
        assert "flowchart TD" in markdown(load_definition(path))


def test_a_wait_for_the_first_event_draws_an_edge_per_event() -> None:
    d = parse_definition(
        """
name: first-event
version: 1
start: hear
steps:
  hear:
    wait:
      any:
        - {signal: paid, next: ship}
        - {duration: 1h, next: remind}
  ship: {succeed: {output: shipped}}
  remind: {fail: {error: Unpaid, message: "no payment"}}
""",
        source="<first-event>",
    )
    body = mermaid(d)
    assert "wait for the first event" in body
    assert '-->|"signal paid"| n2' in body and '-->|"after 1h"| n3' in body
    assert "wf_end" not in body  # each event goes to its own step, none to the end


def test_unknown_step_kinds_are_drawn_as_generic_nodes() -> None:
    @dataclasses.dataclass(frozen=True)
    class TeleportStep:
        id: str
        next: str | None

    d = definition(THREE_STEPS)
    steps: dict[str, Any] = dict(d.steps)
    steps["first"] = TeleportStep("first", "second")
    body = mermaid(dataclasses.replace(d, steps=steps))
    assert step_kind(TeleportStep("x", None)) == "teleport"
    assert '<b>first</b><br/>teleport"]:::other' in body
