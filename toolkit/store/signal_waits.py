"""Which wait a signal is for (docs/composition.md, "Signals to one branch").

The names a definition waits for, the addresses of the branches that wait for a name, and
the payload schema at the wait a signal goes to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolkit.definition import MapStep, ParallelStep, Step, WaitStep, WorkflowDefinition
from toolkit.store.branches import SignalWaiter


def signal_addresses(steps: Mapping[str, Step], name: str, prefix: str = "") -> list[str]:
    """The addresses of the branches whose own steps wait for signal ``name``.

    A map item's index is ``N`` (``N/ship``: branch ``ship`` of the nested step of any
    item); the task's own graph is not a branch and is not listed.
    """
    found = []
    for step in steps.values():
        if isinstance(step, MapStep):
            branches = {"N": step.branch}
        elif isinstance(step, ParallelStep):
            branches = dict(step.branches)
        else:
            continue
        for branch_name, branch in branches.items():
            address = f"{prefix}{branch_name}"
            if any(_waits_for(inner, name) for inner in branch.steps.values()):
                found.append(address)
            found += signal_addresses(branch.steps, name, f"{address}/")
    return sorted(set(found))


def _waits_for(step: Step, name: str) -> bool:
    return isinstance(step, WaitStep) and (
        step.signal == name or any(event.signal == name for event in step.any)
    )


def addresses_match(shape: str, address: str) -> bool:
    """Whether ``address`` (``3/ship``) is one of the shape's (``N/ship``)."""
    parts, wanted = address.split("/"), shape.split("/")
    if len(parts) != len(wanted):
        return False
    pairs = zip(parts, wanted, strict=True)
    return all(part == want or (want == "N" and part.isdigit()) for part, want in pairs)


def branch_signal_schema(
    definition: WorkflowDefinition,
    waiter: SignalWaiter,
    name: str,
    otherwise: Mapping[str, Any] | None,
) -> Mapping[str, Any] | None:
    """The schema of signal ``name`` at the wait step branch ``waiter`` waits at.

    The branch's graph is found from its step occurrence (``each#1/3/checks#1``: step
    ``each``'s branch ``3``, its step ``checks``, then the branch's own name); ``otherwise``
    when the graph or step is not found (a definition changed by a redrive).
    """
    steps: Mapping[str, Step] = definition.steps
    parts = [*waiter.fanout.split("/"), waiter.name]
    for occurrence, branch in zip(parts[::2], parts[1::2], strict=True):
        step = steps.get(occurrence.split("#")[0])
        if isinstance(step, MapStep):
            steps = step.branch.steps
        elif isinstance(step, ParallelStep) and branch in step.branches:
            steps = step.branches[branch].steps
        else:
            return otherwise
    wait = steps.get(waiter.cursor or "")
    if not isinstance(wait, WaitStep):
        return otherwise
    for signal, schema in [(wait.signal, wait.schema), *((e.signal, e.schema) for e in wait.any)]:
        if signal == name:
            return schema
    return otherwise


def signal_waits(
    definition: WorkflowDefinition, cursor: str | None, name: str
) -> tuple[set[str], Mapping[str, Any] | None]:
    """The signal names ``definition``'s wait steps wait for, and the schema for ``name``.

    When the task waits at step ``cursor`` for ``name``, that step's schema decides (none:
    any payload); else the first wait step declaring one for it.

    Returns:
        ``(names, schema)``: every signal name a wait step names, and the JSON Schema a
        payload of ``name`` must match (None: any).
    """
    waited: set[str] = set()
    found: list[tuple[bool, Mapping[str, Any] | None]] = []
    for step in definition.all_steps():
        if not isinstance(step, WaitStep):
            continue
        waits = [(step.signal, step.schema), *((e.signal, e.schema) for e in step.any)]
        for signal, schema in waits:
            if signal is None:
                continue
            waited.add(signal)
            if signal == name:
                found.append((step.id == cursor, schema))
    current = [schema for here, schema in found if here]
    if current:
        return waited, current[0]
    return waited, next((schema for _, schema in found if schema is not None), None)
