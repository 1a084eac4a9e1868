"""Workflow definitions shared by more than one test module, and how tests parse them.

A definition (its YAML text, or the parsed definition) that one module uses lives in that
module; one that several use lives here, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apps.limited import one_step
from toolkit.definition import WorkflowDefinition, parse_definition
from toolkit.errors import DefinitionError, DefinitionFault

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


# --- the definition tests: the corpus, a minimal definition, its faults -----------------------

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


MINIMAL = """\
name: demo
version: 1
start: done
steps:
  done: {succeed: {}}
"""


def faults_of(text: str, source: str = "<string>") -> tuple[DefinitionFault, ...]:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(text, source=source)
    return caught.value.faults


# --- versions ---------------------------------------------------------------------------------

V1 = THREE_STEPS


# --- one step under each limit of tests/apps/limited.py ---------------------------------------

LLM = one_step("lim-llm", "lim.llm", "llm")
API = one_step("lim-api", "lim.api", "api")
SOLO = one_step("lim-solo", "lim.solo", "solo")
FREE = one_step("lim-free", "lim.free", "free")
PER_TENANT = one_step("lim-per-tenant", "lim.per_tenant", "per_tenant")


# --- a timer ----------------------------------------------------------------------------------

TIMER = """
name: timer
version: 1
input: {type: object}
start: pause
steps:
  pause: {wait: {duration: 1h}, next: after}
  after: {effect: count.work, idempotent: false, args: {value: done}}
"""


# --- a map reserving its budget per branch ----------------------------------------------------

RESERVE = """
name: reserve
version: 1
start: fan
steps:
  fan:
    map:
      items: "${ input.items }"
      reserve: {per_branch: {tokens: 50}}
      branch:
        start: call
        steps:
          call: {effect: count.spend, idempotent: true, args: {tokens: "${ context.item }"}}
"""


# --- the history tests' workload (handlers: tests/apps/history.py) ----------------------------

FLOW = parse_definition(
    """
name: hist-flow
version: 1
input: {type: object}
start: first
steps:
  first: {effect: hist.work, idempotent: true, args: {n: "${ input.n }"}, next: second}
  second:
    effect: hist.flaky
    idempotent: true
    retry: {max_attempts: 3, initial: 10ms, factor: 1, max: 10ms}
    next: done
  done: {succeed: {output: "${ steps.first }"}}
""",
    source="<hist-flow>",
)

BROKEN = parse_definition(
    """
name: hist-broken
version: 2
input: {type: object}
start: only
steps:
  only:
    effect: hist.broken
    idempotent: false
    retry: {max_attempts: 1}
""",
    source="<hist-broken>",
)

WAITER = parse_definition(
    """
name: hist-wait
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {signal: go}, next: done}
  done: {succeed: {output: ok}}
""",
    source="<hist-wait>",
)

DEFINITIONS = [FLOW, BROKEN, WAITER]


# --- a slow step (metrics and doctor) ---------------------------------------------------------

SLOW = """
name: slow-metrics
version: 1
input: {type: object}
start: quick
steps:
  quick: {effect: count.work, idempotent: true, next: slow}
  slow: {effect: count.work, idempotent: true, args: {seconds: 30}}
"""


# --- a non-idempotent effect left uncertain (reconciliation) ----------------------------------

UNCERTAIN = """
name: uncertain
version: 1
input: {type: object}
start: charge
steps:
  charge:
    effect: count.work
    idempotent: false
    args: {value: charged}
    retry: {max_attempts: 2, initial: 10ms}
    catch: [{errors: [Declined], next: declined}]
    next: done
  done: {succeed: {output: "${ steps.charge }"}}
  declined: {succeed: {output: declined}}
"""
