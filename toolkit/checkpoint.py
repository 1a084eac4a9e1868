"""The checkpoint: a task's semantic progress as JSON (DESIGN §2), never a pickled coroutine.

It holds the cursor (the next step to run), the recorded outputs of finished steps, how many
times each step has been entered (so each entry is its own *occurrence* with its own
idempotency key), the attempts made at the current occurrence, and the occurrence whose
intent is recorded without an outcome; the same for each branch of a parallel or map step in
progress; what the task waits for; and the task's budget.

Each part is a typed value with its stored JSON form (``to_json`` / ``from_json``). The JSON
is the store's contract: the SQL reads parts of it (``checkpoint -> 'wait'``), stored tasks
hold it, and the golden histories (``tests/corpus/golden/``) pin it. A change of that JSON
is a new :data:`CHECKPOINT_FORMAT` with a migration of stored checkpoints.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from toolkit.waits import (
    AnyWait,
    BranchesWait,
    CallbackWait,
    ChildWait,
    SignalWait,
    Wait,
    wait_from_json,
)

#: Version of the checkpoint layout, stored in every checkpoint. Format 2 (issue 18) keeps
#: the branches of a parallel or map step in rows of their own (``toolkit_branches``), not
#: under ``fanout.branches``; a format-1 checkpoint still loads, its branches are written as
#: rows by its task's next write (:attr:`FanOut.inline`).
CHECKPOINT_FORMAT = 2
#: Formats :meth:`Checkpoint.from_json` reads.
READABLE_FORMATS = frozenset({1, 2})

Json = dict[str, Any]


# --- graphs and branches -----------------------------------------------------------------------


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
        wait: what the graph waits for (one of the :data:`Wait` variants), or None.
        due: not stored: the wait's deadline has passed if it has not ended otherwise.
            Always so for the task (a waiting task is claimed when its wait ends); a
            branch read back waiting knows it from its row's timer.
        in_flight: not stored: ``(occurrence, attempt)`` of the idempotent attempt being
            called now. A write during the call (a sibling branch's end) stores
            ``attempts`` without it, as if written before the call: a takeover counts the
            lost attempt once (see `stored_attempts`).
    """

    cursor: str | None
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    visits: dict[str, int] = dataclasses.field(default_factory=dict)
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)
    pending: str | None = None
    prefix: str = ""
    wait: Wait | None = None
    due: bool = dataclasses.field(default=True, compare=False)
    in_flight: tuple[str, int] | None = dataclasses.field(default=None, compare=False)

    def occurrence(self, step: str) -> str:
        """The occurrence key of the current entry into ``step``, e.g. ``"charge#1"``."""
        return f"{self.prefix}{step}#{self.visits.get(step, 1)}"

    def stored_attempts(self) -> dict[str, int]:
        """``attempts`` as a write stores them: without the attempt in flight, if any."""
        if self.in_flight is None:
            return self.attempts
        occurrence, number = self.in_flight
        attempts = dict(self.attempts)
        if number > 1:
            attempts[occurrence] = number - 1
        else:
            attempts.pop(occurrence, None)
        return attempts

    def enter(self, step: str | None) -> None:
        """Move the cursor to ``step`` (None: nothing left), counting a new occurrence."""
        self.cursor = step
        if step is not None:
            self.visits[step] = self.visits.get(step, 0) + 1


class BranchStatus(enum.StrEnum):
    """Where a branch of a parallel or map step stands."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: an effect of the branch waits for reconciliation
    BLOCKED = "blocked"
    #: the branch waits (a timer, a signal, a callback, a child), holding no lease
    WAITING = "waiting"


@dataclasses.dataclass
class BranchFrame(Frame):
    """One branch of a parallel or map step, stored in a row of its own while the step runs.

    Attributes:
        status: where the branch stands.
        output: the branch's output once it succeeded.
        error: the branch's error once it failed.
        spent: resources spent by the branch's effects (``{"tokens": 120}``).
        run_at: when a waiting branch's wait ends at the latest (ISO-8601, database time);
            None for never.
        fanout: the parallel or map step in progress in this branch (nested fan-out, at
            most ``MAX_FANOUT_DEPTH`` deep); its branches have rows of their own.
    """

    status: BranchStatus = BranchStatus.RUNNING
    output: Any = None
    error: dict[str, Any] | None = None
    spent: dict[str, float] = dataclasses.field(default_factory=dict)
    run_at: str | None = None
    fanout: FanOut | None = None

    @property
    def ended(self) -> bool:
        """Whether the branch has finished (succeeded, failed or cancelled)."""
        return self.status in (BranchStatus.SUCCEEDED, BranchStatus.FAILED, BranchStatus.CANCELLED)

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
            status=BranchStatus(data["status"]),
            output=data.get("output"),
            error=data.get("error"),
            spent=dict(data.get("spent", {})),
            wait=wait_from_json(data.get("wait")),
            run_at=data.get("run_at"),
            due=False,
            fanout=FanOut.from_json(data["fanout"]) if data.get("fanout") else None,
        )

    def to_json(self) -> Json:
        """The branch as stored in its row (``toolkit_branches.frame``)."""
        data: Json = {
            "cursor": self.cursor,
            "outputs": self.outputs,
            "visits": self.visits,
            "attempts": self.stored_attempts(),
            "pending": self.pending,
            "prefix": self.prefix,
            "status": str(self.status),
            "output": self.output,
            "error": self.error,
            "spent": self.spent,
        }
        if self.wait is not None:
            data["wait"] = self.wait.to_json()
            data["run_at"] = self.run_at
        if self.fanout is not None:
            data["fanout"] = self.fanout.to_json()
        return data

    def waits_for(self) -> tuple[str, ...]:
        """What a waiting branch waits for, as its row lists it (``signal:NAME`` ...)."""
        wait = self.wait
        if isinstance(wait, SignalWait):
            return (f"signal:{wait.signal}",)
        if isinstance(wait, AnyWait):
            return tuple(f"signal:{name}" for name in wait.signals)
        if isinstance(wait, CallbackWait):
            return (f"callback:{wait.callback}",)
        if isinstance(wait, ChildWait):
            return (f"child:{wait.child}",)
        if isinstance(wait, BranchesWait):
            return ("branches",)  # its own branches' rows say what they wait for
        return ()


@dataclasses.dataclass
class FanOut:
    """The parallel or map step occurrence in progress.

    Its branches are stored in rows of their own (``toolkit_branches``); the checkpoint
    keeps what the step as a whole needs, so that its size does not grow with the items.

    Attributes:
        occurrence: the step's occurrence.
        started: branches begun so far (a map begins its items in index order; a parallel
            step all its branches at once).
        ended: branches that have ended (succeeded, failed or cancelled).
        failure: ``{"branch", "error"}`` of the first branch that failed (mode ``all`` and
            map); None while none has.
        winner: the branch that won a ``first_success`` race, once one has.
        reserved: what the step reserved from the budgets, by resource; None until it has
            (or when it reserves nothing).
        spent: what its branches spent of the reservation, by resource.
        branches: not stored: the branches this cycle holds in memory, by name (a map
            item's name is its index) — those it resumed or began, not the parked ones.
        inline: not stored: ``branches`` came from a format-1 checkpoint, which kept every
            branch inline; the next write stores them as rows.
    """

    occurrence: str
    started: int = 0
    ended: int = 0
    failure: dict[str, Any] | None = None
    winner: str | None = None
    reserved: dict[str, float] | None = None
    spent: dict[str, float] = dataclasses.field(default_factory=dict)
    branches: dict[str, BranchFrame] = dataclasses.field(default_factory=dict)
    inline: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FanOut:
        """Rebuild the step's state from its stored JSON (format 1 or 2)."""
        inline = {
            name: BranchFrame.from_json(branch)
            for name, branch in (data.get("branches") or {}).items()
        }
        return cls(
            occurrence=data["occurrence"],
            started=int(data.get("started", 0)),
            ended=int(data.get("ended", 0)),
            failure=data.get("failure"),
            winner=data.get("winner"),
            reserved=dict(data["reserved"]) if data.get("reserved") is not None else None,
            spent=dict(data.get("spent") or {}),
            branches=inline,
            inline="branches" in data,
        )

    def to_json(self) -> Json:
        """The step's state as stored under ``checkpoint.fanout``."""
        return {
            "occurrence": self.occurrence,
            "started": self.started,
            "ended": self.ended,
            "failure": self.failure,
            "winner": self.winner,
            "reserved": self.reserved,
            "spent": self.spent,
        }


# --- budgets, callbacks, resolutions, compensation --------------------------------------------


@dataclasses.dataclass
class BudgetLine:
    """The task's budget of one resource, in the resource's unit.

    ``limit``: the amount; ``spent``: what it spent for good; ``reserved``: what its steps
    hold reserved.
    """

    limit: float
    spent: float = 0.0
    reserved: float = 0.0

    @property
    def left(self) -> float:
        """What may still be spent or reserved."""
        return self.limit - self.spent - self.reserved

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"limit": self.limit, "spent": self.spent, "reserved": self.reserved}


@dataclasses.dataclass
class CallbackState:
    """The callback of an effect occurrence in progress.

    ``token``: its token; ``attempt``: the attempt it belongs to; ``called``: whether the
    handler has returned.
    """

    token: str
    attempt: int
    called: bool = False

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"token": self.token, "attempt": self.attempt, "called": self.called}


@dataclasses.dataclass(frozen=True)
class Resolution:
    """An operator's reconciliation of the pending occurrence, for the interpreter to apply.

    ``outcome`` is ``completed`` (with ``result``), ``failed`` (with ``error``) or ``retry``
    (``toolkit reconcile``).
    """

    occurrence: str
    outcome: str
    result: Any = None
    error: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Resolution:
        """Rebuild it from its stored JSON."""
        return cls(data["occurrence"], data["outcome"], data.get("result"), data.get("error"))

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {
            "occurrence": self.occurrence, "outcome": self.outcome, "result": self.result,
            "error": self.error,
        }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Compensable:
    """How to undo a completed effect.

    Its compensating handler, and the arguments rendered when the effect completed.
    """

    step: str
    occurrence: str
    handler: str
    idempotent: bool
    args: Any

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Compensable:
        """Rebuild it from its stored JSON."""
        return cls(
            data["step"], data["occurrence"], data["handler"], bool(data["idempotent"]),
            data.get("args"),
        )  # fmt: skip

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {
            "step": self.step, "occurrence": self.occurrence, "handler": self.handler,
            "idempotent": self.idempotent, "args": self.args,
        }  # fmt: skip


@dataclasses.dataclass
class Compensation:
    """The compensation in progress once the task failed.

    Attributes:
        error: the task's error (it ends with it, marked with how compensation went).
        outcomes: what each compensation came to, oldest first (``{"step", "occurrence",
            "handler", "outcome", "result" | "error"}``).
        frame: the compensation being run, with its own attempts and pending intent.
    """

    error: dict[str, Any]
    outcomes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    frame: BranchFrame | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Compensation:
        """Rebuild it from its stored JSON."""
        frame = data.get("frame")
        return cls(
            error=dict(data["error"]),
            outcomes=list(data.get("outcomes") or []),
            frame=BranchFrame.from_json(frame) if frame is not None else None,
        )

    def to_json(self) -> Json:
        """The stored JSON form."""
        data: Json = {"error": self.error, "outcomes": self.outcomes}
        if self.frame is not None:
            data["frame"] = self.frame.to_json()
        return data


@dataclasses.dataclass(frozen=True)
class Lapses:
    """Leases that lapsed in a row at a pure step without the task finishing a step.

    ``count`` of them, while ``steps_run`` stayed what it is here and the database server
    stayed the one that started at ``server_started`` (a lapse across a restart of the
    server is an outage's, not the task's). Cleared once the task finishes a step.
    """

    count: int
    steps_run: int
    server_started: str

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {
            "count": self.count, "steps_run": self.steps_run,
            "server_started": self.server_started,
        }  # fmt: skip


# --- the task's checkpoint ---------------------------------------------------------------------


@dataclasses.dataclass
class Checkpoint(Frame):
    """Mutable progress of one task, owned by the interpreter while it holds the lease.

    Besides the task's own graph (see `Frame`):

    Attributes:
        steps_run: steps executed so far, pure ones included.
        resolution: an operator's reconciliation of the pending occurrence, to apply.
        fanout: the parallel or map step in progress, or None.
        budget: the task's budget by resource.
        started_at: when the task first ran (ISO-8601), recorded once: ``context.started_at``.
        compensable: the compensations of completed effects, oldest first.
        compensating: the compensation in progress once the task failed; None before.
        callbacks: the callbacks of effect occurrences in progress, by occurrence.
        lapses: leases lapsed in a row without progress, once one has (see `Lapses`).
    """

    steps_run: int = 0
    resolution: Resolution | None = None
    fanout: FanOut | None = None
    budget: dict[str, BudgetLine] = dataclasses.field(default_factory=dict)
    started_at: str | None = None
    compensable: list[Compensable] = dataclasses.field(default_factory=list)
    compensating: Compensation | None = None
    callbacks: dict[str, CallbackState] = dataclasses.field(default_factory=dict)
    lapses: Lapses | None = None

    @classmethod
    def initial(cls, start: str, budget: Mapping[str, float] | None = None) -> Checkpoint:
        """The checkpoint of a task that has not run yet: the cursor on ``start``.

        Args:
            start: the first step.
            budget: the task's budget by resource (amounts), or None for none.
        """
        lines = {resource: BudgetLine(float(amount)) for resource, amount in (budget or {}).items()}
        return cls(cursor=start, visits={start: 1}, budget=lines)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Checkpoint:
        """Rebuild a checkpoint from its stored JSON.

        Raises:
            ValueError: the JSON was written by an unknown checkpoint format.
        """
        if data.get("format") not in READABLE_FORMATS:
            raise ValueError(f"unknown checkpoint format {data.get('format')!r}")
        resolution = data.get("resolution")
        fanout = data.get("fanout")
        compensating = data.get("compensating")
        lapses = data.get("lapses")
        lapsed = (
            Lapses(int(lapses["count"]), int(lapses["steps_run"]), str(lapses["server_started"]))
            if lapses
            else None
        )
        return cls(
            cursor=data["cursor"],
            outputs=dict(data.get("outputs", {})),
            visits=dict(data.get("visits", {})),
            attempts=dict(data.get("attempts", {})),
            pending=data.get("pending"),
            steps_run=int(data.get("steps_run", 0)),
            wait=wait_from_json(data.get("wait")),
            resolution=Resolution.from_json(resolution) if resolution else None,
            fanout=FanOut.from_json(fanout) if fanout is not None else None,
            budget={
                resource: BudgetLine(*(float(line[k]) for k in ("limit", "spent", "reserved")))
                for resource, line in (data.get("budget") or {}).items()
            },
            started_at=data.get("started_at"),
            compensable=[Compensable.from_json(entry) for entry in data.get("compensable") or []],
            compensating=Compensation.from_json(compensating) if compensating else None,
            callbacks={
                occurrence: CallbackState(entry["token"], int(entry["attempt"]), entry["called"])
                for occurrence, entry in (data.get("callbacks") or {}).items()
            },
            lapses=lapsed,
        )

    def to_json(self) -> Json:
        """The JSON stored in ``toolkit_tasks.checkpoint``."""
        data: Json = {
            "format": CHECKPOINT_FORMAT,
            "cursor": self.cursor,
            "outputs": self.outputs,
            "visits": self.visits,
            "attempts": self.stored_attempts(),
            "pending": self.pending,
            "steps_run": self.steps_run,
            "wait": self.wait.to_json() if self.wait is not None else None,
            "resolution": self.resolution.to_json() if self.resolution is not None else None,
        }
        if self.fanout is not None:
            data["fanout"] = self.fanout.to_json()
        if self.budget:
            data["budget"] = {resource: line.to_json() for resource, line in self.budget.items()}
        if self.started_at:
            data["started_at"] = self.started_at
        if self.compensable:
            data["compensable"] = [entry.to_json() for entry in self.compensable]
        if self.compensating:
            data["compensating"] = self.compensating.to_json()
        if self.callbacks:
            data["callbacks"] = {occ: state.to_json() for occ, state in self.callbacks.items()}
        if self.lapses is not None:
            data["lapses"] = self.lapses.to_json()
        return data

    def enter(self, step: str | None) -> None:
        """Move the cursor to ``step`` (None: nothing left), counting a new occurrence."""
        self.steps_run += 1
        self.lapses = None
        super().enter(step)
