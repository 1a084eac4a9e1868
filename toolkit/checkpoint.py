"""The checkpoint: a task's semantic progress as JSON (DESIGN §2), never a pickled coroutine.

It holds the cursor (the next step to run), the recorded outputs of finished steps, how many
times each step has been entered (so each entry is its own *occurrence* with its own
idempotency key), the attempts made at the current occurrence, and the occurrence whose
intent is recorded without an outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: Version of the checkpoint layout, stored in every checkpoint.
CHECKPOINT_FORMAT = 1


@dataclasses.dataclass
class Checkpoint:
    """Mutable progress of one task, owned by the interpreter while it holds the lease.

    Attributes:
        cursor: id of the next step to run; None once the task is terminal.
        outputs: step id to the output of its latest finished occurrence.
        visits: step id to the number of times the step has been entered.
        attempts: occurrence to attempts begun there (lost ones included).
        pending: occurrence whose ``started`` evidence has no outcome yet.
        steps_run: steps executed so far, pure ones included.
        wait: the wait in progress: ``{"occurrence": ..., "signal": name}`` or
            ``{"occurrence": ..., "timer": true}``.
        resolution: an operator's reconciliation of the pending occurrence, for the
            interpreter to apply: ``{"occurrence", "outcome", "result", "error"}``.
    """

    cursor: str | None
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    visits: dict[str, int] = dataclasses.field(default_factory=dict)
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)
    pending: str | None = None
    steps_run: int = 0
    wait: dict[str, Any] | None = None
    resolution: dict[str, Any] | None = None

    @classmethod
    def initial(cls, start: str) -> Checkpoint:
        """The checkpoint of a task that has not run yet: the cursor on ``start``."""
        return cls(cursor=start, visits={start: 1})

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
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON stored in ``toolkit_tasks.checkpoint``."""
        return {
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

    def occurrence(self, step: str) -> str:
        """The occurrence key of the current entry into ``step``, e.g. ``"charge#1"``."""
        return f"{step}#{self.visits.get(step, 1)}"

    def enter(self, step: str | None) -> None:
        """Move the cursor to ``step`` (None: nothing left), counting a new occurrence."""
        self.steps_run += 1
        self.cursor = step
        if step is not None:
            self.visits[step] = self.visits.get(step, 0) + 1
