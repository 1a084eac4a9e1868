"""The children a redrive touches: those it redrives with their parent, those it replaces.

A resumed ``workflow`` step's failed or cancelled child is redriven from its own failed
step, and the parent waits for it again. A resumed distributed map's failed or cancelled
items are redriven too (an item whose input its workflow refused is not: it would fail the
same way), and the map counts them again once they end (docs/composition.md#distributed-map).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from toolkit.checkpoint import BranchFrame, Checkpoint, Frame
from toolkit.definition import DistributedMapStep, MapStep, ParallelStep, WorkflowStep

if TYPE_CHECKING:
    from toolkit.store.redrive_plan import RedriveFacts, RedrivePlan

#: Errors of a distributed map's item that a redrive would only repeat: its input was refused.
_REFUSED_INPUT = ("InputError", "PayloadRefused")


@dataclasses.dataclass(frozen=True)
class ChildRedrive:
    """A child task the redrive touches.

    ``redriven``: the child (failed or cancelled) is redriven from its own failed step and
    the parent waits for it again; else the re-planned step starts a new child and this one
    is left as it is. ``plan``: the child's own plan when redriven. ``item``: it is an item
    of a distributed map (a preview lists the first few).
    """

    step: str
    child_id: int
    redriven: bool
    plan: RedrivePlan | None = None
    item: bool = False


def top_step(occurrence: str) -> str:
    """The task-level step of an occurrence: ``each`` of ``each#1/3/charge#1``."""
    return occurrence.split("/", 1)[0].rsplit("#", 1)[0]


def children_to_redrive(
    facts: RedriveFacts,
    cp: Checkpoint,
    step: str,
    old: set[str],
    frames: Sequence[Mapping[str, Any]],
) -> list[ChildRedrive]:
    """Children to redrive, and those a new child replaces.

    A resumed ``workflow`` step's failed child, a resumed distributed map's failed items.

    Args:
        facts: what the store recorded of the task (``children`` by parent occurrence).
        cp: the checkpoint the task resumes from.
        step: the step it resumes at.
        old: occurrences whose steps run again as new occurrences.
        frames: the branch rows of the step in progress, if it is a parallel or map step.
    """
    target = facts.target
    out: list[ChildRedrive] = []
    resumed: list[tuple[str, Frame, Mapping[str, Any]]] = [(step, cp, target.steps)]
    fan_step = target.steps[step]
    for row in frames:
        branch = BranchFrame.from_json(row["frame"])
        if branch.cursor is not None and isinstance(fan_step, ParallelStep | MapStep):
            graph = (
                fan_step.branch if isinstance(fan_step, MapStep) else fan_step.branches[row["name"]]
            )
            resumed.append((branch.cursor, branch, graph.steps))
    for name, frame, steps in resumed:
        if isinstance(steps.get(name), DistributedMapStep):
            prefix = f"{frame.occurrence(name)}/"
            out += [
                ChildRedrive(name, int(child["id"]), True, item=True)
                for occ, child in facts.children.items()
                if occ.startswith(prefix) and child["state"] in ("failed", "cancelled")
                and child.get("error_name") not in _REFUSED_INPUT
            ]  # fmt: skip
            continue
        if not isinstance(steps.get(name), WorkflowStep):
            continue
        child = facts.children.get(frame.occurrence(name))
        if child is not None and child["state"] in ("failed", "cancelled"):
            out.append(ChildRedrive(name, int(child["id"]), True))
    for occ, child in facts.children.items():
        if occ in old:
            out.append(ChildRedrive(top_step(occ), int(child["id"]), False))
    return out
