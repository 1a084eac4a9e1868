"""What happened to each step of a definition in one task: the path the TaskBrowser colours.

:func:`task_path` reads only what the detail pane has already loaded: the task row (its
state, wait reason, error and checkpoint: the cursor, how often each step was entered, the
recorded outputs, the compensation in progress), its events (``caught``, ``compensated``,
the branch events) and its effect evidence. It looks at the task's own steps; a parallel or
map step is one step, its branches summed up in its note.

The rules, first match wins (the latest occurrence of a step entered more than once
decides, as the checkpoint keeps it):

1. A step whose compensation is in progress is ``waiting`` (the task waits for it) or
   ``current``.
2. The step that failed the task (``error.step``; while compensating, the error being
   compensated for) is ``failed``.
3. The cursor of a task that has not ended (or was cancelled) is ``waiting`` when the task
   waits, else ``current``.
4. A step whose latest occurrence failed and a ``catch`` rule took the task on, or that the
   workflow deadline abandoned for ``on_timeout`` (its output is that error), is
   ``failed``.
5. A step whose compensations ran is ``compensated``, or ``failed`` if one of them failed
   for good.
6. A step entered (the checkpoint counts it, or it has evidence) is ``done``.
7. Any other is ``not_reached``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from toolkit.counts import counted
from toolkit.definition import WorkflowDefinition
from toolkit.lifecycle import TERMINAL_STATES, EventKind, StepStatus, TaskState
from toolkit.store.tasks import TaskRecord

__all__ = ["StepMark", "task_path", "top_step"]

#: Where the engine keeps a compensation's occurrences: ``compensate/<occurrence>/...``.
_COMPENSATION = "compensate"
_BRANCH_ENDS = {
    EventKind.BRANCH_SUCCEEDED: "succeeded",
    EventKind.BRANCH_FAILED: "failed",
    EventKind.BRANCH_CANCELLED: "cancelled",
}


@dataclasses.dataclass(frozen=True)
class StepMark:
    """What happened to one step in one task.

    Attributes:
        status: the step's colour on the path.
        note: why, in a few words, and what else the task records of the step (the
            drawing's tooltip): ``"the task failed here (NoCourier); ship#1 failed at
            attempt 3"``, ``"compensated by payments.refund"``, ``"entered 2 times"``;
            ``""`` when there is nothing to say (a step not reached).
    """

    status: StepStatus
    note: str


def top_step(occurrence: str) -> tuple[str, bool]:
    """The task's own step an occurrence key belongs to, and whether it is a compensation's.

    Args:
        occurrence: an evidence record's occurrence: ``"charge#2"``, a branch's
            ``"fan#1/a/charge#1"`` or a compensation's ``"compensate/charge#1/charge#1"``.

    Returns:
        ``("charge", False)``, ``("fan", False)``, ``("charge", True)``.
    """
    parts = occurrence.split("/")
    compensation = parts[0] == _COMPENSATION and len(parts) > 1
    first = parts[1] if compensation else parts[0]
    return first.rsplit("#", 1)[0], compensation


def _is_timeout(output: object) -> bool:
    """Whether a step's recorded output is the ``Timeout`` the workflow deadline left it."""
    error = output.get("error") if isinstance(output, Mapping) and len(output) == 1 else None
    return isinstance(error, Mapping) and error.get("name") == "Timeout"


def _error_name(error: object) -> str:
    name = error.get("name") if isinstance(error, Mapping) else None
    return str(name) if name else "an error"


class _Facts:
    """What the task row, its events and its evidence say about its steps."""

    def __init__(
        self,
        task: TaskRecord,
        events: Sequence[Mapping[str, Any]],
        evidence: Sequence[Mapping[str, Any]],
    ) -> None:
        checkpoint = task.checkpoint if isinstance(task.checkpoint, Mapping) else {}
        self.task = task
        self.cursor: str | None = checkpoint.get("cursor")
        self.visits: Mapping[str, int] = checkpoint.get("visits") or {}
        self.outputs: Mapping[str, Any] = checkpoint.get("outputs") or {}
        compensating = checkpoint.get("compensating")
        self.compensating = isinstance(compensating, Mapping)
        error: Any = None
        if isinstance(compensating, Mapping):
            error = compensating.get("error")
            frame = compensating.get("frame")
            left = checkpoint.get("compensable") or []
            if isinstance(frame, Mapping):  # prefix "compensate/<occurrence>/"
                self.undoing: str | None = top_step(str(frame.get("prefix", "")))[0]
            else:  # between two compensations: the newest one left is next
                self.undoing = str(left[-1].get("step")) if left else None
        else:
            self.undoing = None
            error = task.error if task.state == TaskState.FAILED else None
        self.error: Any = error
        self.failing = error.get("step") if isinstance(error, Mapping) else None
        self.caught: dict[str, Mapping[str, Any]] = {}
        self.timed_out: set[str] = set()
        self.undone: dict[str, list[Mapping[str, Any]]] = {}
        self.branches: dict[str, dict[str, int]] = {}
        for event in events:
            detail = event.get("detail") or {}
            step = detail.get("step")
            kind = event.get("kind")
            if not isinstance(step, str) or ("branch" in detail and kind == EventKind.CAUGHT):
                continue  # a catch inside a branch is the branch's
            if kind == EventKind.CAUGHT:
                self.caught[step] = detail
            elif kind == EventKind.DEADLINE_PASSED:  # abandoned there, on to on_timeout
                self.timed_out.add(step)
            elif kind == EventKind.COMPENSATED:
                self.undone.setdefault(step, []).append(detail)
            elif kind == EventKind.FANOUT_STARTED:  # a new run of the step: count afresh
                self.branches[step] = {"started": int(detail.get("branches") or 0)}
            elif kind in _BRANCH_ENDS:
                counts = self.branches.setdefault(step, {"started": 0})
                counts[_BRANCH_ENDS[kind]] = counts.get(_BRANCH_ENDS[kind], 0) + 1
        self.recorded: set[str] = set()
        self.last: dict[str, Mapping[str, Any]] = {}  # an effect's newest evidence record
        for record in evidence:
            occurrence = str(record.get("occurrence") or "")
            step, compensation = top_step(occurrence)
            if compensation:
                continue  # the compensated events say how it went
            self.recorded.add(step)
            if "/" not in occurrence:
                self.last[step] = record

    def mark(self, step: str) -> StepMark:
        """The status of ``step`` (the rules of the module), with its note."""
        state = self.task.state
        waits = state == TaskState.WAITING
        reason = f" ({self.task.wait_reason})" if self.task.wait_reason else ""
        if step == self.undoing:
            if waits:
                return StepMark(StepStatus.WAITING, f"its compensation waits{reason}")
            if state in TERMINAL_STATES:
                return StepMark(StepStatus.CURRENT, "cancelled while being compensated")
            return StepMark(StepStatus.CURRENT, f"being compensated ({state})")
        if step == self.failing:
            why = f"the task failed here ({_error_name(self.error)})"
            if self.compensating:
                why += ", compensating the steps before it"
            return self._mark(step, StepStatus.FAILED, why)
        if step == self.cursor and not self.compensating and state not in _FINISHED:
            if waits:
                return self._mark(step, StepStatus.WAITING, f"the task waits here{reason}")
            why = {
                TaskState.QUEUED: "the task's next step (queued)",
                TaskState.LEASED: "running now (leased)",
                TaskState.CANCELLED: "the task was cancelled here",
            }.get(TaskState(state), state)
            return self._mark(step, StepStatus.CURRENT, why)
        caught = self.caught.get(step)
        output = self.outputs.get(step)
        if caught is not None and output == {"error": caught.get("error")}:
            why = f"{_error_name(caught.get('error'))}, caught: went to {caught.get('next')}"
            return self._mark(step, StepStatus.FAILED, why)
        if step in self.timed_out and _is_timeout(output):
            return self._mark(step, StepStatus.FAILED, "the workflow deadline passed here")
        undone = self.undone.get(step)
        if undone:
            bad = [u for u in undone if u.get("outcome") != "completed"]
            if bad:
                why = f"its compensation failed ({_error_name(bad[-1].get('error'))})"
                return self._mark(step, StepStatus.FAILED, why)
            why = f"compensated by {undone[-1].get('handler')}"
            return self._mark(step, StepStatus.COMPENSATED, why)
        if self.visits.get(step, 0) > 0 or step in self.recorded:
            return self._mark(step, StepStatus.DONE, None)
        return StepMark(StepStatus.NOT_REACHED, "")

    def _mark(self, step: str, status: StepStatus, why: str | None) -> StepMark:
        """A mark whose note is ``why``, then what else the task records of the step.

        That is: how often it was entered, its newest evidence record, its branches.
        """
        parts = [why] if why else []
        entered = int(self.visits.get(step, 0))
        if entered > 1:
            parts.append(f"entered {entered} times")
        record = self.last.get(step)
        if record is not None:
            parts.append(
                f"{record.get('occurrence')} {record.get('record')}"
                f" at attempt {record.get('attempt')}"
            )
        counts = self.branches.get(step)
        if counts is not None:
            ends = ", ".join(
                f"{counts[outcome]} {outcome}"
                for outcome in _BRANCH_ENDS.values()
                if counts.get(outcome)
            )
            branches = counted(counts["started"], "branch", "branches")
            parts.append(branches + (f" ({ends})" if ends else ""))
        return StepMark(status, "; ".join(parts))


#: States in which the cursor is no step the task is at (it moved on to the end).
_FINISHED = frozenset({TaskState.SUCCEEDED, TaskState.FAILED})


def task_path(
    task: TaskRecord,
    events: Sequence[Mapping[str, Any]],
    evidence: Sequence[Mapping[str, Any]],
    definition: WorkflowDefinition,
) -> dict[str, StepMark]:
    """What happened to each of the definition's steps in the task (the module's rules).

    Args:
        task: the task row (``store.tasks.get``).
        events: its events, oldest first (``store.tasks.events``: ``kind`` and ``detail``).
        evidence: its effect evidence, oldest first (``store.tasks.evidence``:
            ``occurrence``, ``record``, ``attempt``).
        definition: the definition the task is pinned to.

    Returns:
        Step id to its `StepMark`, for every step of the definition (its own, not those of
        branches), in document order.
    """
    facts = _Facts(task, events, evidence)
    return {step: facts.mark(step) for step in definition.steps}
