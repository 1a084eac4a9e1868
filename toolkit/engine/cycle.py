"""One claim-and-execute cycle: the claimed task, its checkpoint, and what is not yet written.

A :class:`Cycle` lives as long as one lease. Steps change its checkpoint and append effect
evidence, events and consumed signals to it; :meth:`Cycle.commit` writes all of that in one
fenced write (DESIGN §2, §4), and :meth:`Cycle.retrying` makes any store call again while
the lease surely holds and the database is unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import enum
import functools
import json
import math
import random
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from toolkit import faults
from toolkit.application import App, SpendLedger, SpendLimits
from toolkit.application.context import StopFlag
from toolkit.checkpoint import BranchFrame, Checkpoint, Frame
from toolkit.definition import WorkflowDefinition
from toolkit.engine.failures import Error
from toolkit.errors import DatabaseUnavailable, PayloadRefused, ResultNotJson, ResultTooLarge
from toolkit.lifecycle import TERMINAL_STATES, EventKind, TaskState
from toolkit.metrics import WorkerMetrics
from toolkit.payload import check_payload
from toolkit.store import Store
from toolkit.store.leases import ClaimedTask
from toolkit.store.writes import BranchRow, Event, EvidenceRecord, FencedWrite

T = TypeVar("T")

#: Backoff between two tries of a store call while the database is unreachable, seconds.
STORE_RETRY_MIN = 0.05
STORE_RETRY_MAX = 2.0
#: A run of pure steps yields to the event loop at least this often, seconds of its work.
PACE_YIELD = 0.005
#: anyio's token of the event loop that asked last, and that loop (`Cycle.loop_token`).
_LOOP_TOKEN: list[tuple[asyncio.AbstractEventLoop, anyio.lowlevel.EventLoopToken]] = []
#: The lock of a cycle's writes when no branches run: its one coroutine writes in turn.
_ALONE = contextlib.nullcontext()


class CycleOutcome(enum.StrEnum):
    """How one claim-and-execute cycle ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING = "waiting"
    RETRY = "retry"
    LEASE_LOST = "lease_lost"
    RELEASED = "released"
    DATABASE_UNAVAILABLE = "database_unavailable"


class WorkerStopping(Exception):
    """The worker stops, and the cycle was about to call an effect that is not idempotent.

    It releases the task at that step instead (`CycleControl.stopping`).
    """


@dataclasses.dataclass
class CycleControl:
    """Why a cycle is being cancelled, set by the supervisor before it cancels the scope.

    Attributes:
        cancel_requested: the task's cancel request (``{"reason", "at"}``), learned at a
            heartbeat; None when there is none.
        lease_lost: the heartbeat found the lease gone.
        deadline: event-loop time of the workflow deadline (the supervisor cancels the cycle
            then).
        call_stop: the stop flag of the handler call in progress (``ctx.cancelled``); a new
            one per call, so a timed-out call does not stop the next; None before the first.
        lease_deadline: event-loop time (``anyio.current_time()``) until which the lease is
            surely held: the time a claim or renewal was sent plus the lease duration. Until
            then a store call that finds the database unreachable is tried again with
            backoff (the fence makes a repeated write safe); after it, the cycle gives up
            and the lease lapses. The default, minus infinity, never tries again.
        call_grace: how long past its step's timeout a handler call may go on before the
            supervisor gives it up (the call ignores its cancellation), seconds.
        calls: the calls with a timeout in progress, by call, each with the event-loop time
            it is given up at (timeout plus ``call_grace``) and its step.
        abandoned: the supervisor gave this cycle up (its call ignored a cancellation):
            it holds no lease any more and is not counted; if the call ever returns, the
            cycle writes nothing (``lease_lost`` is set too).
        progress_every: how often a run of pure steps commits its progress, seconds (the
            supervisor's heartbeat interval, well inside the lease; `Cycle.pace`).
        outage_seen: the worker found the database unreachable within one lease duration
            before this claim: a lapsed lease it takes over may be the outage's, so it is not
            counted against the task (`TaskGraph`).
        checkpoint_window: idempotent outcomes may wait this long, seconds, for a later
            write of the cycle (`Cycle.may_defer_write`); 0 writes each before the next call.
        stopping: the worker is shutting down: the cycle starts no new call of an effect
            that is not idempotent, whose cut-off at the end of the grace would need
            reconciliation; it releases the task there instead (`WorkerStopping`).
    """

    cancel_requested: dict[str, Any] | None = None
    lease_lost: bool = False
    deadline: float = math.inf
    call_stop: StopFlag | None = None
    lease_deadline: float = -math.inf
    call_grace: float = 5.0
    calls: dict[int, tuple[float, str]] = dataclasses.field(default_factory=dict)
    abandoned: bool = False
    progress_every: float = 1.0
    outage_seen: bool = False
    checkpoint_window: float = 0.0
    stopping: bool = False

    def new_call(self) -> StopFlag:
        """A fresh stop flag for the next handler call."""
        self.call_stop = StopFlag()
        return self.call_stop


@dataclasses.dataclass
class HeldBranch:
    """A branch the cycle holds in memory, and what of it the store has.

    ``written``: its frame as last written (JSON text), None before its first write;
    ``release``: drop it once a write carries its state (it ended or parked).
    """

    frame: BranchFrame
    fanout: str
    name: str
    position: int
    written: str | None = None
    seen: int = 0
    release: bool = False


@dataclasses.dataclass(frozen=True)
class Services:
    """What every cycle of one interpreter uses.

    The store, the handlers, the worker's id, the metrics (None for none) and how a fenced
    write is applied (one statement, or the supervisor's group commit).
    """

    store: Store
    app: App
    worker_id: str
    metrics: WorkerMetrics | None
    apply: Callable[[FencedWrite], Awaitable[TaskState]]


class Cycle:
    """The state of one cycle: the task, its lease, the checkpoint and what is not yet written.

    Args:
        task: the claimed task.
        definition: the graph its checkpoint was written under.
        control: the supervisor's side of the cycle.
        services: the interpreter's store, handlers and commit.
    """

    def __init__(
        self,
        task: ClaimedTask,
        definition: WorkflowDefinition,
        control: CycleControl,
        services: Services,
    ) -> None:
        self.task = task
        self.definition = definition
        self.control = control
        self.services = services
        self.fence = task.fence(services.worker_id)
        self.checkpoint = Checkpoint.from_json(task.checkpoint)
        self.evidence: list[EvidenceRecord] = []
        self.events: list[Event] = []
        self.signals: list[tuple[int, str]] = []
        #: Every signal this cycle took, written or not: a write in flight has not marked
        #: them consumed yet, so no other branch of the cycle may take one again; branches
        #: look for a signal one at a time (``signal_lock``).
        self.signals_taken: list[int] = []
        self.budget_delta: dict[str, float] = {}
        #: Tags handlers set (``ctx.tag``), not yet written; and the task's tags with them.
        self.tags: dict[str, str] = {}
        self.tags_now: dict[str, str] = dict(task.tags)
        #: Reservations returned by steps that ended, by resource (see `FencedWrite`).
        self.budget_released: dict[str, float] = {}
        #: What concurrent calls reported and is not charged yet (see `SpendLedger`).
        self.spend_ledger = SpendLedger()
        self.cancelled_at_commit = False
        #: The traceparent of this cycle's span, carried by its next write (tracing on).
        self.trace_attempt: str | None = None
        self.writes = 0
        #: Event-loop time of the claim or of the last write built, kept only under a
        #: checkpoint window (see `may_defer_write`).
        self._written_at = anyio.current_time() if control.checkpoint_window > 0 else 0.0
        #: Something not yet written must be written before the next call (slots taken).
        self.prompt_write = False
        #: Branches of a parallel or map step run now, concurrently: writes take turns
        #: (``lock``), a write begun is finished even if its branch is cancelled, and the
        #: checkpoint is copied into each write (a branch may change it while one waits).
        self.fanning_out = False
        #: Commits asked for, and the number of them the last write began after: a commit
        #: asked for while another is written joins the next write (see `commit`).
        self._commits_asked = 0
        self._commits_written = 0
        #: A write built whose apply did not return (it raised or was cancelled): it may or
        #: may not be in the store, and it carried evidence, events and branch rows no
        #: later write repeats, so the next write of the cycle sends it again first (its
        #: write id makes that safe) and is built only once it is known applied.
        self._unapplied: FencedWrite | None = None
        #: Branches held in memory, by (step occurrence, name): each write carries those
        #: whose frame changed since it was last written (`hold_branch`).
        self._branches: dict[tuple[str, str], HeldBranch] = {}
        #: Steps whose branches ended: the next write deletes their rows.
        self._branches_ended: list[str] = []

        #: The workflow deadline was met by going to ``on_timeout``: writes clear it.
        self.clear_deadline = False
        #: Event-loop times the run of pure steps in progress began (or last committed) and
        #: last yielded; None between runs (see `pace`).
        self._pure_since: float | None = None
        self._yielded_at = 0.0

    @functools.cached_property
    def lock(self) -> anyio.Lock:
        """Writes take turns while branches run (see :meth:`commit`).

        Taken at every write of a branch and rarely held by another, so a free lock is taken
        without a turn of the event loop. Made when branches first write.
        """
        return anyio.Lock(fast_acquire=True)

    @property
    def loop_token(self) -> anyio.lowlevel.EventLoopToken:
        """The event loop's token, for a handler's code in a thread (``EffectContext``).

        Asked of anyio once per event loop rather than at each call or cycle: it finds the
        running library anew each time.
        """
        loop = asyncio.get_running_loop()
        if not _LOOP_TOKEN or _LOOP_TOKEN[0][0] is not loop:
            _LOOP_TOKEN[:] = [(loop, anyio.lowlevel.current_token())]
        return _LOOP_TOKEN[0][1]

    @functools.cached_property
    def signal_lock(self) -> anyio.Lock:
        """Branches look for a signal one at a time (see :attr:`signals_taken`).

        Made when first needed, as most cycles take no signal.
        """
        return anyio.Lock()

    @property
    def dirty(self) -> bool:
        """Whether evidence, events, signals, budget changes or tags are not yet written."""
        return bool(
            self.evidence or self.events or self.signals or self.budget_delta
            or self.budget_released or self.tags
        )

    def scope(
        self, frame: Frame | None = None, outer: Mapping[str, Any] | None = None, **context: Any
    ) -> dict[str, Any]:
        """The expression scope: at the task's level, or in a branch's ``frame``.

        In a branch, ``steps`` holds the step outputs its enclosing level sees (``outer``;
        default the task's) overlaid with the branch's, and ``context`` adds the branch name
        (``item`` / ``index`` in a map, ``parent`` in a nested step's branch).
        """
        frame = frame or self.checkpoint
        steps = self.checkpoint.outputs if outer is None else outer
        if frame is not self.checkpoint:
            steps = {**steps, **frame.outputs}
        return {
            "input": self.task.input,
            "steps": steps,
            "context": {
                "task_id": self.task.id,
                "tenant": self.task.tenant,
                "workflow": self.definition.name,
                "version": self.definition.version,
                "step": frame.cursor,
                "started_at": self.checkpoint.started_at,
                **context,
            },
        }

    def set_tags(self, tags: dict[str, str]) -> None:
        """Tags a call set (``ctx.tag``), to write with its outcome evidence."""
        self.tags.update(tags)
        self.tags_now.update(tags)

    def next_write_id(self) -> str:
        """A new write id under this lease (see `FencedWrite.write_id`)."""
        self.writes += 1
        return f"{self.task.token}:{self.writes}"

    def checkpoint_json(self) -> dict[str, Any]:
        """The checkpoint as JSON; a copy while branches run (see :attr:`fanning_out`)."""
        data = self.checkpoint.to_json()
        return copy.deepcopy(data) if self.fanning_out else data

    def hold_branch(
        self, fanout: str, name: str, position: int, frame: BranchFrame, *,
        stored: dict[str, Any] | None = None, seen: int = 0, stored_seen: int = 0,
    ) -> None:  # fmt: skip
        """Hold a branch in memory: from now on each write carries it when it changed.

        Args:
            fanout: its step occurrence.
            name: its name.
            position: its order among the step's branches.
            frame: its progress.
            stored: its frame as read from its row (None: not stored yet, or stored
                inline by a format-1 checkpoint: the next write stores it).
            seen: the wakes its row had when read (the next write records them handled).
            stored_seen: the wakes its row recorded handled when read.
        """
        written = json.dumps(stored, sort_keys=True) if stored is not None else None
        if seen != stored_seen:
            written = None  # its row must record the wakes handled, changed or not
        self._branches[(fanout, name)] = HeldBranch(frame, fanout, name, position, written, seen)

    def release_branch(self, fanout: str, name: str) -> None:
        """Drop a branch that ended or parked from memory once a write has carried it."""
        held = self._branches.get((fanout, name))
        if held is not None:
            held.release = True

    def end_branches(self, fanout: str) -> None:
        """The step ``fanout`` ended: drop its branches; the next write deletes their rows.

        The rows of steps nested in its branches (occurrences under ``fanout/``) go too:
        those of a cancelled branch may be left.
        """
        nested = f"{fanout}/"
        for key in [k for k in self._branches if k[0] == fanout or k[0].startswith(nested)]:
            del self._branches[key]
        self._branches_ended.append(fanout)

    def _branch_rows(self) -> tuple[BranchRow, ...]:
        """The held branches whose frame changed since last written; drop released ones."""
        rows = []
        for key, held in list(self._branches.items()):
            frame = held.frame
            data = frame.to_json()
            text = json.dumps(data, sort_keys=True)
            if text != held.written:
                held.written = text
                row = BranchRow(
                    held.fanout, held.name, held.position, str(frame.status),
                    json.loads(text), frame.run_at, frame.waits_for(), held.seen,
                )  # fmt: skip
                rows.append(row)
            if held.release:
                del self._branches[key]
        return tuple(rows)

    def write(self, **fields: Any) -> FencedWrite:
        """A fenced write of the current checkpoint plus everything not yet written."""
        branches_ended = tuple(self._branches_ended)
        self._branches_ended.clear()
        ends = fields.get("state") in TERMINAL_STATES and self.task.child
        write = FencedWrite(
            branches=self._branch_rows(),
            branches_ended=branches_ended,
            ends_child=ends,
            fence=self.fence,
            checkpoint=self.checkpoint_json(),
            evidence=tuple(self.evidence),
            events=tuple(self.events),
            signals=tuple(self.signals),
            write_id=self.next_write_id(),
            budget_delta=dict(self.budget_delta) or None,
            budget_released=dict(self.budget_released) or None,
            clear_deadline=self.clear_deadline,
            tags=dict(self.tags) or None,
            trace_attempt=self.trace_attempt,
            **fields,
        )
        self.trace_attempt = None
        if self.control.checkpoint_window > 0:
            self._written_at = anyio.current_time()
        self.prompt_write = False
        self.tags.clear()
        self.evidence.clear()
        self.events.clear()
        self.signals.clear()
        self.budget_delta.clear()
        self.budget_released.clear()
        return write

    def may_defer_write(self) -> bool:
        """Whether what is not yet written may wait for a later write of this cycle.

        True while the cycle's last write (or its claim) is less than
        ``control.checkpoint_window`` seconds old, the lease surely holds (a write would
        find out that it does not: a worker paused past its lease must not call on), and all
        that waits is the outcome of idempotent calls that spent nothing and took no
        downstream-limit slot, with their events and tags: a crash loses at most that window
        of idempotent work, which is called again with the same keys (docs/decisions.md,
        "Idempotent outcomes may share a write").
        """
        control = self.control
        if (
            control.checkpoint_window <= 0 or control.lease_lost or self.prompt_write
            or self.fanning_out or self.signals or self.budget_delta or self.budget_released
            or self._branches or self._branches_ended or self._unapplied is not None
        ):  # fmt: skip
            return False
        now = anyio.current_time()
        if now - self._written_at >= control.checkpoint_window or now >= control.lease_deadline:
            return False
        return all(
            r.idempotent and r.record == "completed" and r.spend is None for r in self.evidence
        )

    async def commit(self, **fields: Any) -> None:
        """Write the checkpoint and everything not yet written, in one fenced write.

        ``fields`` are the write's other fields (``state``, ``wait_reason``, ``run_at`` ...).

        Raises:
            LeaseLost: the lease is gone; nothing was written.
            DatabaseUnavailable: the database stayed unreachable while the lease surely held.
        """
        # Branches share the cycle: one write at a time, and a branch being cancelled (a
        # race decided) finishes the write it has begun. A commit asked for while another
        # is written joins the next write: many branch ends of one task share one commit.
        shield = anyio.CancelScope(shield=True) if self.fanning_out else contextlib.nullcontext()
        with shield:
            self._commits_asked += 1
            asked = self._commits_asked
            # (one write at a time is a given without branches: the lock is for those)
            async with self.lock if self.fanning_out else _ALONE:
                if self._unapplied is not None:
                    await self._send(self._unapplied)
                if not fields and self._commits_written >= asked:
                    return  # a write built after this commit was asked for carried it
                covered = self._commits_asked
                await self._send(self.write(**fields))
                self._commits_written = covered

    async def _send(self, write: FencedWrite) -> None:
        """Apply ``write`` (again, when it is the unapplied one); see :meth:`commit`."""
        self._unapplied = write
        applied = await self.retrying(functools.partial(self.services.apply, write))
        self._unapplied = None
        if applied != write.state:  # a cancel request found by the write itself
            self.cancelled_at_commit = True
        metrics = self.services.metrics
        if metrics is not None and write.wait_reason is not None:
            metrics.child(metrics.waits, self.definition.name, write.wait_reason).inc()
        if faults.ARMED:
            for record in write.evidence:
                if record.record == "completed":
                    faults.fault_point("after_commit", record.step)

    async def pace(self) -> None:
        """Before a pure step: yield to the event loop now and then, and commit progress.

        Pure steps need no write each (DESIGN §4), but a run of them must neither starve
        the worker (heartbeats, signals, shutdown) nor run on unseen: it yields every
        :data:`PACE_YIELD` seconds and commits the checkpoint every
        ``control.progress_every`` seconds, so that ``steps_run`` is durable and
        ``max_steps`` ends a loop of pure steps.

        Raises:
            LeaseLost, DatabaseUnavailable: as :meth:`commit`.
        """
        now = anyio.current_time()
        if self._pure_since is None:
            self._pure_since = self._yielded_at = now
            return
        if now - self._yielded_at >= PACE_YIELD:
            await anyio.lowlevel.checkpoint()
            self._yielded_at = anyio.current_time()
        if now - self._pure_since >= self.control.progress_every:
            await self.commit()
            self._pure_since = anyio.current_time()

    def unpaced(self) -> None:
        """Before a step that is not pure: the run of pure steps, if any, has ended."""
        self._pure_since = None

    async def retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """Make a store call, again with backoff while the lease surely holds (`retrying`)."""
        return await retrying(self.control, call)

    def check_result(self, value: Any, step: str, source: str) -> None:
        """Check that a step's result can be stored within the payload limits.

        Raises:
            ResultTooLarge: over the size or nesting limit.
            ResultNotJson: not storable JSON (a non-JSON type, NaN, a NUL character ...).
        """
        try:
            check_payload(value, self.services.store.leases.payload_limits)
        except PayloadRefused as exc:
            where = f"{source} of step {step!r} returned a value"
            if exc.limit is not None:
                raise ResultTooLarge(
                    f"{where} over the payload limit: {exc}", step=step, path=exc.path,
                    limit=exc.limit,
                ) from exc  # fmt: skip
            raise ResultNotJson(f"{where} that cannot be stored as JSON: {exc}") from exc

    def charge(self, spend: dict[str, float]) -> None:
        """Charge spend outside any reservation to the task's budget and its tenant's."""
        for resource, amount in spend.items():
            if resource in self.checkpoint.budget:
                self.checkpoint.budget[resource].spent += amount
            self.budget_delta[resource] = self.budget_delta.get(resource, 0.0) + amount

    def spend_limits(self) -> SpendLimits:
        """What the task may still spend outside reservations, by budgeted resource."""
        pools: dict[str, tuple[Hashable, float]] = {
            resource: (("task", resource), line.left)
            for resource, line in self.checkpoint.budget.items()
        }
        return pools

    def retry_scheduled(
        self, step: str, occurrence: str, attempt: int, error: Error | None, delay: float
    ) -> None:
        """Record that a failed attempt at ``step`` is tried again in ``delay`` seconds."""
        detail: dict[str, Any] = {"step": step, "attempt": attempt, "delay_seconds": delay}
        if occurrence != self.checkpoint.occurrence(step):
            detail["occurrence"] = occurrence
        self.events.append(Event(EventKind.RETRY_SCHEDULED, {**detail, "error": error}))
        metrics = self.services.metrics
        if metrics is not None:
            metrics.child(metrics.retries, self.definition.name).inc()

    def reconciliation_required(self, step: str, occurrence: str, error: Error | None) -> None:
        """Record that ``occurrence``'s outcome is unknown and an operator must say it."""
        detail: dict[str, Any] = {"step": step, "occurrence": occurrence}
        if error is not None:
            detail["error"] = error
        self.events.append(Event(EventKind.RECONCILIATION_REQUIRED, detail))


async def retrying(control: CycleControl, call: Callable[[], Awaitable[T]]) -> T:
    """Make a store call, again with backoff while the database is unreachable.

    Tries again until ``control.lease_deadline``: a repeated call is safe because reads are
    reads and every write is fenced and carries its write id.

    Raises:
        DatabaseUnavailable: the database stayed unreachable up to the deadline.
    """
    delay = STORE_RETRY_MIN
    while True:
        try:
            return await call()
        except DatabaseUnavailable:
            pause = delay * (0.5 + random.random() / 2)
            if anyio.current_time() + pause >= control.lease_deadline or control.lease_lost:
                raise
        await anyio.sleep(pause)
        delay = min(delay * 2, STORE_RETRY_MAX)
