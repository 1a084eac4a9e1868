"""The checkpoint: a task's semantic progress as JSON (DESIGN §2), never a pickled coroutine.

It holds the cursor (the next step to run), the recorded outputs of finished steps, how many
times each step has been entered (so each entry is its own *occurrence* with its own
idempotency key), the attempts made at the current occurrence, and the occurrence whose
intent is recorded without an outcome; the same for each branch of a parallel or map step in
progress; and the task's budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: Version of the checkpoint layout, stored in every checkpoint.
CHECKPOINT_FORMAT = 1


@dataclasses.dataclass
class Frame:
    """The progress of one graph: the task's own, or one branch of a parallel or map step.

    Attributes:
        cursor: id of the next step to run; None once the graph has ended.
        outputs: step id to the output of its latest finished occurrence.
        visits: step id to the number of times the step has been entered.
        attempts: occurrence to attempts begun there (lost ones included).
        pending: occurrence whose ``started`` evidence has no outcome yet.
        prefix: prepended to every occurrence key of this graph: ``""`` for the task,
            ``"fan#1/fast/"`` for branch ``fast`` of the first occurrence of step ``fan``.
    """

    cursor: str | None
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    visits: dict[str, int] = dataclasses.field(default_factory=dict)
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)
    pending: str | None = None
    prefix: str = ""

    def occurrence(self, step: str) -> str:
        """The occurrence key of the current entry into ``step``, e.g. ``"charge#1"``."""
        return f"{self.prefix}{step}#{self.visits.get(step, 1)}"

    def enter(self, step: str | None) -> None:
        """Move the cursor to ``step`` (None: nothing left), counting a new occurrence."""
        self.cursor = step
        if step is not None:
            self.visits[step] = self.visits.get(step, 0) + 1


@dataclasses.dataclass
class BranchFrame(Frame):
    """One branch of a parallel or map step, kept in the checkpoint while the step runs.

    Attributes:
        status: ``running``, ``succeeded``, ``failed``, ``cancelled``, or ``blocked`` (an
            effect of the branch waits for reconciliation).
        output: the branch's output once it succeeded.
        error: the branch's error once it failed.
        spent: resources spent by the branch's effects (``{"tokens": 120}``).
    """

    status: str = "running"
    output: Any = None
    error: dict[str, Any] | None = None
    spent: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def ended(self) -> bool:
        """Whether the branch has finished (succeeded, failed or cancelled)."""
        return self.status in ("succeeded", "failed", "cancelled")

    @classmethod
    def start(cls, start: str, prefix: str) -> BranchFrame:
        """A branch that has not run yet."""
        return cls(cursor=start, visits={start: 1}, prefix=prefix)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BranchFrame:
        """Rebuild a branch from its stored JSON."""
        return cls(
            cursor=data["cursor"],
            outputs=dict(data.get("outputs", {})),
            visits=dict(data.get("visits", {})),
            attempts=dict(data.get("attempts", {})),
            pending=data.get("pending"),
            prefix=data["prefix"],
            status=data["status"],
            output=data.get("output"),
            error=data.get("error"),
            spent=dict(data.get("spent", {})),
        )

    def to_json(self) -> dict[str, Any]:
        """The branch as stored under ``checkpoint.fanout.branches``."""
        return {
            "cursor": self.cursor,
            "outputs": self.outputs,
            "visits": self.visits,
            "attempts": self.attempts,
            "pending": self.pending,
            "prefix": self.prefix,
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "spent": self.spent,
        }


@dataclasses.dataclass
class Checkpoint(Frame):
    """Mutable progress of one task, owned by the interpreter while it holds the lease.

    Besides the task's own graph (see `Frame`):

    Attributes:
        steps_run: steps executed so far, pure ones included.
        wait: the wait in progress: ``{"occurrence": ..., "signal": name}``,
            ``{"occurrence": ..., "timer": true}``, ``{"occurrence": ..., "child": id}``
            or ``{"occurrence": ..., "budget": n}`` (the n-th deferral).
        resolution: an operator's reconciliation of the pending occurrence, for the
            interpreter to apply: ``{"occurrence", "outcome", "result", "error"}``.
        fanout: the parallel or map step in progress: ``{"occurrence", "branches": {name:
            BranchFrame JSON}, "winner", "reserved", "spent"}``; None when there is none.
        budget: the task's budget by resource: ``{"tokens": {"limit", "spent",
            "reserved"}}`` (amounts in the resource's unit).
        started_at: when the task first ran (ISO-8601), recorded once: ``context.started_at``.
        compensable: the compensations of completed effects, oldest first: ``{"step",
            "occurrence", "handler", "args", "idempotent"}`` (args already rendered).
        compensating: the compensation in progress once the task failed: ``{"error",
            "outcomes", "frame"}``; None while the task has not failed.
        callbacks: the callbacks of effect occurrences in progress, by occurrence:
            ``{"token", "attempt", "called"}`` (``called``: the handler has returned).
    """

    steps_run: int = 0
    wait: dict[str, Any] | None = None
    resolution: dict[str, Any] | None = None
    fanout: dict[str, Any] | None = None
    budget: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    started_at: str | None = None
    compensable: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    compensating: dict[str, Any] | None = None
    callbacks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def initial(cls, start: str, budget: Mapping[str, float] | None = None) -> Checkpoint:
        """The checkpoint of a task that has not run yet: the cursor on ``start``.

        Args:
            start: the first step.
            budget: the task's budget by resource (amounts), or None for none.
        """
        limits = {
            resource: {"limit": float(amount), "spent": 0.0, "reserved": 0.0}
            for resource, amount in (budget or {}).items()
        }
        return cls(cursor=start, visits={start: 1}, budget=limits)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Checkpoint:
        """Rebuild a checkpoint from its stored JSON.

        Raises:
            ValueError: the JSON was written by an unknown checkpoint format.
        """
        if data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"unknown checkpoint format {data.get('format')!r}")
        return cls(
            cursor=data["cursor"],
            outputs=dict(data.get("outputs", {})),
            visits=dict(data.get("visits", {})),
            attempts=dict(data.get("attempts", {})),
            pending=data.get("pending"),
            steps_run=int(data.get("steps_run", 0)),
            wait=data.get("wait"),
            resolution=data.get("resolution"),
            fanout=data.get("fanout"),
            budget=dict(data.get("budget") or {}),
            started_at=data.get("started_at"),
            compensable=list(data.get("compensable") or []),
            compensating=data.get("compensating"),
            callbacks=dict(data.get("callbacks") or {}),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON stored in ``toolkit_tasks.checkpoint``."""
        data = {
            "format": CHECKPOINT_FORMAT,
            "cursor": self.cursor,
            "outputs": self.outputs,
            "visits": self.visits,
            "attempts": self.attempts,
            "pending": self.pending,
            "steps_run": self.steps_run,
            "wait": self.wait,
            "resolution": self.resolution,
        }
        if self.fanout is not None:
            data["fanout"] = self.fanout
        if self.budget:
            data["budget"] = self.budget
        for key in ("started_at", "compensable", "compensating", "callbacks"):
            value = getattr(self, key)
            if value:
                data[key] = value
        return data

    def enter(self, step: str | None) -> None:
        """Move the cursor to ``step`` (None: nothing left), counting a new occurrence."""
        self.steps_run += 1
        super().enter(step)
