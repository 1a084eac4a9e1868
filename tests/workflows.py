"""Small workflow definitions shared by the store and worker tests."""

from __future__ import annotations

from toolkit.definition import WorkflowDefinition, parse_definition

THREE_STEPS = """
name: three-steps
version: 1
input: {type: object}
start: first
steps:
  first:
    effect: count.work
    idempotent: true
    args: {value: "${ input.n }"}
    next: second
  second:
    effect: count.work
    idempotent: false
    args: {value: "${ steps.first.value }"}
    next: route
  route:
    choice:
      - when: "${ steps.second.value == `0` }"
        next: zero
    default: third
  zero:
    succeed: {output: zero}
  third:
    effect: count.work
    idempotent: true
    args: {value: "${ steps.second.value }"}
"""

FIVE_SLOW_STEPS = """
name: five-slow
version: 1
input: {type: object}
start: s1
steps:
  s1: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: s2}
  s2: {effect: count.work, idempotent: false, args: {seconds: "${ input.seconds }"}, next: s3}
  s3: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: s4}
  s4: {effect: count.work, idempotent: false, args: {seconds: "${ input.seconds }"}, next: s5}
  s5: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: done}
  done: {succeed: {output: "${ steps.s5 }"}}
"""


def definition(text: str) -> WorkflowDefinition:
    return parse_definition(text, source="<test>")
