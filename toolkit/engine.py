"""The interpreter: resume a task from its checkpoint and run its steps (DESIGN §2, §4).

One call of :meth:`Interpreter.execute` is one claim-and-execute cycle for one task. Pure
steps (choice, succeed, fail) need no write of their own; the evidence of a finished effect
is committed together with whatever comes next (the next intent, the wait, or the terminal
state), always by one fenced statement.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import enum
import functools
import json
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import anyio
import psycopg

from toolkit import faults
from toolkit._definition_checks import json_type
from toolkit.budgets import Budgets, ReservationOutcome
from toolkit.callbacks import Callbacks, new_token
from toolkit.catalog import DefinitionCatalog
from toolkit.checkpoint import BranchFrame, Checkpoint, Frame
from toolkit.children import Children
from toolkit.definition import (
    Branch,
    ChoiceStep,
    EffectStep,
    FailStep,
    MapStep,
    ParallelStep,
    RetryPolicy,
    SetStep,
    SucceedStep,
    WaitStep,
    WorkflowDefinition,
    WorkflowStep,
    catch_target,
)
from toolkit.errors import (
    DatabaseUnavailable,
    DefinitionRetired,
    ExpressionError,
    HandlerNotFound,
    InputError,
    LeaseLost,
    PayloadRefused,
    ResultNotJson,
    ResultTooLarge,
    StoreError,
    TaskTerminal,
    UnknownDefinition,
)
from toolkit.expressions import compile_template, is_truthy
from toolkit.leases import (
    NEVER,
    ClaimedTask,
    Event,
    EvidenceRecord,
    FencedWrite,
    Leases,
    TaskState,
)
from toolkit.limits import LimitDeferral, Limits
from toolkit.metrics import WorkerMetrics
from toolkit.payload import check_payload
from toolkit.registry import App, EffectContext, Handler, SpendLedger, SpendLimits, SpendMeter
from toolkit.tasks import Tasks

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Most characters of an error message stored with a task or its evidence.
MAX_ERROR_MESSAGE = 4000
#: Backoff between two tries of a store call while the database is unreachable, seconds.
STORE_RETRY_MIN = 0.05
STORE_RETRY_MAX = 2.0
#: Pause between two looks at a callback awaited inside a branch (which keeps its lease), s.
CALLBACK_POLL = 0.5
#: Longest pause before a task deferred for budget looks again, seconds.
BUDGET_RECHECK_MAX = 60.0
#: Longest pause of a branch whose effect waits for a downstream limit before it looks
#: again, seconds (a branch keeps the task's lease, so no released slot can wake it).
LIMIT_BRANCH_RECHECK = 1.0
#: Error names never retried: a budget does not grow by calling again.
NEVER_RETRIED = frozenset({"BudgetExceeded", "HandlerArgumentsMismatch"})

ConnectionFactory = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]
Error = dict[str, Any]


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


@dataclasses.dataclass
class CycleControl:
    """Why a cycle is being cancelled, set by the supervisor before it cancels the scope.

    Attributes:
        cancel_requested: the task's cancel request (``{"reason", "at"}``), learned at a
            heartbeat; None when there is none.
        lease_lost: the heartbeat found the lease gone.
        call_stop: the stop flag of the handler call in progress (``ctx.cancelled``); a new
            one per call, so a timed-out call does not stop the next.
        lease_deadline: event-loop time (``anyio.current_time()``) until which the lease is
            surely held: the time a claim or renewal was sent plus the lease duration. Until
            then a store call that finds the database unreachable is tried again with
            backoff (the fence makes a repeated write safe); after it, the cycle gives up
            and the lease lapses. The default, minus infinity, never tries again.
    """

    cancel_requested: dict[str, Any] | None = None
    lease_lost: bool = False
    #: Event-loop time of the workflow deadline (the supervisor cancels the cycle then).
    deadline: float = math.inf
    call_stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    lease_deadline: float = -math.inf

    def new_call(self) -> threading.Event:
        """A fresh stop flag for the next handler call."""
        self.call_stop = threading.Event()
        return self.call_stop


def error_data(exc: BaseException) -> Error:
    """The JSON form of an error raised by a handler or the engine.

    The name is the exception's ``error_name`` attribute when it has one, else its class
    name; it is what ``retry.non_retryable`` and ``catch`` rules match.
    """
    name = getattr(exc, "error_name", None) or type(exc).__name__
    return {
        "name": storable_text(str(name), 200),
        "message": storable_text(str(exc) or type(exc).__name__),
    }


def storable_text(text: str, limit: int = MAX_ERROR_MESSAGE) -> str:
    """``text`` as PostgreSQL can store it in JSON: no NUL, valid Unicode, at most ``limit``.

    NUL characters become a backslash and ``0``, unpaired surrogates ``?``; a longer text is
    cut and marked with ``...``.
    """
    text = text.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Cycle:
    """State of one cycle: the task, its lease, the checkpoint and what is not yet written."""

    def __init__(
        self, task: ClaimedTask, definition: WorkflowDefinition, control: CycleControl
    ) -> None:
        self.task = task
        self.definition = definition
        self.control = control
        self.checkpoint = Checkpoint.from_json(task.checkpoint)
        self.evidence: list[EvidenceRecord] = []
        self.events: list[Event] = []
        self.signals: list[tuple[int, str]] = []
        self.budget_delta: dict[str, float] = {}
        #: Reservations returned by steps that ended, by resource (see `FencedWrite`).
        self.budget_released: dict[str, float] = {}
        #: What concurrent calls reported and is not charged yet (see `SpendLedger`).
        self.spend_ledger = SpendLedger()
        self.cancelled_at_commit = False
        self.writes = 0
        #: The branches of the parallel or map step in progress, by name (their JSON is
        #: written under ``checkpoint.fanout.branches``).
        self.frames: dict[str, BranchFrame] = {}
        #: One write at a time: the branches of a parallel or map step commit concurrently.
        self.lock = anyio.Lock()
        #: The compensation in progress (written under ``checkpoint.compensating.frame``).
        self.compensation: BranchFrame | None = None
        #: The workflow deadline was met by going to ``on_timeout``: writes clear it.
        self.clear_deadline = False

    @property
    def dirty(self) -> bool:
        return bool(
            self.evidence or self.events or self.signals or self.budget_delta
            or self.budget_released
        )

    def scope(self, frame: Frame | None = None, **context: Any) -> dict[str, Any]:
        """The expression scope: at the task's level, or in a branch's ``frame``.

        In a branch, ``steps`` holds the task's step outputs overlaid with the branch's, and
        ``context`` adds the branch name (and ``item`` / ``index`` in a map).
        """
        frame = frame or self.checkpoint
        steps = self.checkpoint.outputs
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

    def next_write_id(self) -> str:
        """A new write id under this lease (see `FencedWrite.write_id`)."""
        self.writes += 1
        return f"{self.task.token}:{self.writes}"

    def checkpoint_json(self) -> dict[str, Any]:
        """The checkpoint as JSON, branches in progress included.

        While branches run concurrently, the JSON is a copy: a branch may change its frame
        while the write waits for the database.
        """
        if self.compensation is not None:
            assert self.checkpoint.compensating is not None
            self.checkpoint.compensating["frame"] = self.compensation.to_json()
        if not self.frames:
            return self.checkpoint.to_json()
        assert self.checkpoint.fanout is not None
        self.checkpoint.fanout["branches"] = {
            name: frame.to_json() for name, frame in self.frames.items()
        }
        return copy.deepcopy(self.checkpoint.to_json())

    def write(self, **fields: Any) -> FencedWrite:
        """A fenced write of the current checkpoint plus everything not yet written."""
        write = FencedWrite(
            task_id=self.task.id,
            token=self.task.token,
            checkpoint=self.checkpoint_json(),
            evidence=tuple(self.evidence),
            events=tuple(self.events),
            signals=tuple(self.signals),
            write_id=self.next_write_id(),
            budget_delta=dict(self.budget_delta) or None,
            budget_released=dict(self.budget_released) or None,
            clear_deadline=self.clear_deadline,
            **fields,
        )
        self.evidence.clear()
        self.events.clear()
        self.signals.clear()
        self.budget_delta.clear()
        self.budget_released.clear()
        return write

    def charge(self, spend: dict[str, float]) -> None:
        """Charge spend outside any reservation to the task's budget and its tenant's."""
        for resource, amount in spend.items():
            if resource in self.checkpoint.budget:
                self.checkpoint.budget[resource]["spent"] += amount
            self.budget_delta[resource] = self.budget_delta.get(resource, 0.0) + amount

    def spend_limits(self) -> dict[str, tuple[Hashable, float]]:
        """What the task may still spend outside reservations, by budgeted resource."""
        return {
            resource: (("task", resource), entry["limit"] - entry["spent"] - entry["reserved"])
            for resource, entry in self.checkpoint.budget.items()
        }


@dataclasses.dataclass
class _Attempt:
    """What one attempt at an effect came to.

    ``kind`` is ``completed`` (with ``result``), ``failed`` (with ``error``; ``final`` when
    no retry may follow whatever the policy) or ``reconcile`` (outcome unknown, not
    idempotent: fail closed, with ``error`` when a timeout made it unknown). ``deferred``: a
    downstream limit was full, nothing was called (``result`` is the ``LimitDeferral``).
    """

    kind: str
    occurrence: str
    attempt: int = 0
    result: Any = None
    error: Error | None = None
    final: bool = False


class Interpreter:
    """Runs claimed tasks with the handlers of one :class:`~toolkit.registry.App`.

    Args:
        leases: the store's fenced writes.
        app: the handler registry.
        worker_id: the id every write is fenced with.
        connection: factory for ``EffectContext.connection()``.
        metrics: where step durations, waits and retries are recorded; None for nowhere.
        commit: how fenced writes are applied; default one statement each
            (``Leases.commit``); the supervisor passes its group commit.
    """

    def __init__(
        self,
        leases: Leases,
        app: App,
        worker_id: str,
        connection: ConnectionFactory,
        metrics: WorkerMetrics | None = None,
        commit: Callable[[FencedWrite], Awaitable[TaskState]] | None = None,
    ) -> None:
        self._leases = leases
        self._app = app
        self._worker_id = worker_id
        self._connection = connection
        self._metrics = metrics
        self._apply = commit or functools.partial(leases.commit, worker_id)
        self._budgets = Budgets(leases.database)
        self._limits = Limits(leases.database)
        self._callbacks = Callbacks(leases.database)
        self._children = Children(leases.database)
        self._catalog = DefinitionCatalog(leases.database)
        self._tasks = Tasks(leases.database)

    async def execute(
        self,
        task: ClaimedTask,
        definition: WorkflowDefinition,
        control: CycleControl | None = None,
    ) -> CycleOutcome:
        """Run ``task`` from its checkpoint until it ends, waits or is released.

        If the surrounding scope is cancelled, the cycle ends the lease protocol before the
        cancellation propagates: a requested cancel is committed as the ``cancelled`` state;
        a shutdown releases the task; a lost lease writes nothing.

        Returns:
            How the cycle ended. Never raises for lease loss or an unreachable database:
            those end the cycle (the lease lapses and another claim resumes the task). While
            ``control.lease_deadline`` has not passed, a store call that finds the database
            unreachable is tried again with backoff; past it the outcome is ``LEASE_LOST``
            (without a deadline, ``DATABASE_UNAVAILABLE``). A write the database refuses, or
            an error of the engine itself, fails the task with a clean fenced write rather
            than leaving it to be claimed again and again.
        """
        control = control or CycleControl()
        try:
            cycle = _Cycle(task, definition, control)
            if task.cancel_requested:
                return await self._cancel(cycle, task.cancel_requested)
            outcome = await self._run(cycle, control)
            return CycleOutcome.CANCELLED if cycle.cancelled_at_commit else outcome
        except LeaseLost:
            logger.warning(
                "lease lost; the task will be resumed by its next claim",
                extra={"action": "lease_lost", "task_id": task.id, "token": task.token},
            )
            return CycleOutcome.LEASE_LOST
        except DatabaseUnavailable as exc:
            # One line per outage is the supervisor's; this one is per task, for debugging.
            gave_up = math.isfinite(control.lease_deadline)
            logger.info(
                "database unavailable during a cycle%s: %s",
                "; its lease lapses" if gave_up else "",
                exc,
                extra={"action": "cycle_database_unavailable", "task_id": task.id},
            )
            return CycleOutcome.LEASE_LOST if gave_up else CycleOutcome.DATABASE_UNAVAILABLE
        except StoreError as exc:
            logger.warning(
                "the database refused a write; failing the task: %s",
                exc,
                extra={"action": "write_refused", "task_id": task.id},
            )
            return await self._fail_cleanly(task, control, "StoreRefused", str(exc))
        except anyio.get_cancelled_exc_class():
            control.call_stop.set()
            if not control.lease_lost:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await self._end_interrupted(cycle, control)
            raise
        except Exception as exc:  # a fault of the engine or of stored data: never a crash loop
            logger.exception(
                "internal error in a cycle; failing the task",
                extra={"action": "internal_error", "task_id": task.id},
            )
            return await self._fail_cleanly(
                task, control, "InternalError", f"{type(exc).__name__}: {exc}"
            )

    async def _fail_cleanly(
        self, task: ClaimedTask, control: CycleControl, name: str, message: str
    ) -> CycleOutcome:
        """Fail the task over the checkpoint it has in the store.

        Used when the database refused a write (a value it cannot store) or the engine
        failed: nothing more of the cycle's progress is written, so the task never stays
        stuck on a write that cannot succeed. What the cycle did write stays consistent with
        the checkpoint (a reservation it took is returned as the task ends).
        """
        step = task.checkpoint.get("cursor") if isinstance(task.checkpoint, dict) else None
        error = {"name": name, "message": storable_text(message), "step": step}
        write = FencedWrite(
            task_id=task.id,
            token=task.token,
            checkpoint=None,
            state="failed",
            error=error,
            events=(Event("failed", {"error": error}),),
            write_id=f"{task.token}:failed",
        )
        try:
            await self._retrying(control, functools.partial(self._apply, write))
        except (LeaseLost, DatabaseUnavailable, StoreError):
            return CycleOutcome.LEASE_LOST
        return CycleOutcome.FAILED

    async def _retrying(self, control: CycleControl, call: Callable[[], Awaitable[T]]) -> T:
        """Make a store call, again with backoff while the database is unreachable.

        Tries again until ``control.lease_deadline``: a repeated call is safe because reads
        are reads and every write is fenced and carries its write id.

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

    async def _end_interrupted(self, cycle: _Cycle, control: CycleControl) -> None:
        try:
            if control.cancel_requested is not None:
                await self._cancel(cycle, control.cancel_requested)
            else:
                # At the workflow deadline the next claim (at once) applies it.
                past = anyio.current_time() >= control.deadline
                reason = "workflow deadline" if past else "worker stopping"
                cycle.events.append(Event("released", {"reason": reason}))
                await self._commit(cycle, state="queued", delay_seconds=0)
        except (LeaseLost, DatabaseUnavailable):
            pass  # the lease lapses on its own; the next claim resumes from the checkpoint

    async def _commit(self, cycle: _Cycle, **fields: Any) -> None:
        # Branches share the cycle: one write at a time, and a branch being cancelled (a
        # race decided) finishes the write it has begun.
        with anyio.CancelScope(shield=bool(cycle.frames)):
            async with cycle.lock:
                write = cycle.write(**fields)
                applied = await self._retrying(
                    cycle.control, functools.partial(self._apply, write)
                )
        if applied != write.state:  # a cancel request found by the write itself
            cycle.cancelled_at_commit = True
        if self._metrics is not None and write.wait_reason is not None:
            self._metrics.waits.labels(cycle.definition.name, write.wait_reason).inc()
        if faults.ARMED:
            for record in write.evidence:
                if record.record == "completed":
                    faults.fault_point("after_commit", record.step)

    async def _run(self, cycle: _Cycle, control: CycleControl) -> CycleOutcome:
        try:
            return await self._steps(cycle, control)
        except (ExpressionError, ResultNotJson, ResultTooLarge, HandlerNotFound) as exc:
            # A fault of the definition or the application, not of one attempt: the task fails.
            return await self._fail(cycle, error_data(exc))

    async def _steps(self, cycle: _Cycle, control: CycleControl) -> CycleOutcome:
        cp = cycle.checkpoint
        outcome: CycleOutcome | None = None
        if cp.started_at is None:  # recorded once: context.started_at is the same on resume
            cp.started_at = datetime.datetime.now(datetime.UTC).isoformat()
        if cycle.task.deadline_in is not None and cycle.task.deadline_in <= 0:
            outcome = await self._deadline_passed(cycle)
            if outcome is not None:
                return outcome
        if cp.compensating is not None:
            return await self._compensate(cycle, control)
        if cycle.task.recovered:
            outcome = await self._count_lost_attempt(cycle)
            if outcome is not None:
                return outcome
        while True:
            assert cp.cursor is not None, "a task with no cursor is terminal"
            if cp.steps_run >= cycle.definition.max_steps:
                message = (
                    f"the task ran {cp.steps_run} steps, its definition's max_steps: a loop "
                    "that does not end?"
                )
                return await self._fail(cycle, {"name": "MaxStepsExceeded", "message": message})
            step = cycle.definition.steps[cp.cursor]
            if isinstance(step, ChoiceStep):
                scope = cycle.scope()
                target = next(
                    (rule.next for rule in step.choices if is_truthy(rule.when.render(scope))),
                    step.default,
                )
                if target is None:
                    message = f"no choice of step {step.id!r} matched"
                    return await self._fail(cycle, {"name": "NoChoiceMatched", "message": message})
                cp.enter(target)
                continue
            if isinstance(step, SucceedStep):
                output = step.output.render(cycle.scope())
                self._check_result(output, step.id, "the output")
                return await self._succeed(cycle, output)
            if isinstance(step, FailStep):
                message = step.message.render(cycle.scope())
                text = message if isinstance(message, str) else json.dumps(message)
                return await self._fail(
                    cycle, {"name": step.error, "message": text}, compensate=step.compensate
                )
            if isinstance(step, SetStep):
                values = step.values.render(cycle.scope())
                self._check_result(values, step.id, "the values")
                outcome = await self._advance(cycle, step, values)
            elif isinstance(step, WaitStep):
                outcome = await self._wait(cycle, step)
            elif isinstance(step, ParallelStep | MapStep):
                outcome = await self._fanout(cycle, step, control)
            elif isinstance(step, WorkflowStep):
                outcome = await self._child(cycle, step, control)
            else:
                outcome = await self._effect(cycle, step, control)
            if outcome is not None:
                return outcome

    async def _advance(self, cycle: _Cycle, step: _NextStep, output: Any) -> CycleOutcome | None:
        """Record a step's output and move on; a step without ``next`` ends the workflow."""
        cp = cycle.checkpoint
        cp.outputs[step.id] = output
        if step.next is None:
            return await self._succeed(cycle, output)
        cp.enter(step.next)
        return None

    async def _step_failed(
        self, cycle: _Cycle, step: _CatchingStep, error: Error
    ) -> CycleOutcome | None:
        """A step failed for good: route to its ``catch`` target, else fail the task."""
        target = catch_target(step.catch, error["name"])
        if target is None:
            return await self._fail(cycle, {**error, "step": step.id})
        cycle.checkpoint.outputs[step.id] = {"error": error}
        cycle.events.append(Event("caught", {"step": step.id, "error": error, "next": target}))
        cycle.checkpoint.enter(target)
        return None

    # --- effects ------------------------------------------------------------------------------

    async def _count_lost_attempt(self, cycle: _Cycle) -> CycleOutcome | None:
        """A takeover: the previous lease expired mid-cycle. That attempt counts."""
        cp = cycle.checkpoint
        assert cp.cursor is not None
        step = cycle.definition.steps[cp.cursor]
        if not isinstance(step, EffectStep):
            return None
        error = _lost_attempt(cycle, cp, step)
        if error is not None:
            return await self._step_failed(cycle, step, error)
        await self._commit(cycle)
        return None

    async def _effect(
        self, cycle: _Cycle, step: EffectStep, control: CycleControl
    ) -> CycleOutcome | None:
        cp = cycle.checkpoint
        done = await self._attempt(
            cycle, cp, step, control, cycle.scope(), cycle.spend_limits, cycle.charge
        )
        if done.kind == "completed":
            return await self._advance(cycle, step, done.result)
        if done.kind == "reconcile":
            return await self._reconcile(cycle, step, done.occurrence, done.error)
        if done.kind == "callback":
            return await self._await_callback(cycle, step, done.occurrence)
        if done.kind == "deferred":
            return await self._limit_deferred(cycle, step, done)
        assert done.error is not None
        delay = _retry_delay(step, done)
        if delay is None:
            cp.attempts.pop(done.occurrence, None)
            return await self._step_failed(cycle, step, {**done.error, "attempts": done.attempt})
        self._retry_scheduled(cycle, step, done, delay)
        await self._commit(cycle, state="queued", delay_seconds=delay)
        return CycleOutcome.RETRY

    def _retry_scheduled(
        self, cycle: _Cycle, step: EffectStep, done: _Attempt, delay: float
    ) -> None:
        detail = {"step": step.id, "attempt": done.attempt, "delay_seconds": delay}
        if done.occurrence != cycle.checkpoint.occurrence(step.id):
            detail["occurrence"] = done.occurrence
        cycle.events.append(Event("retry_scheduled", {**detail, "error": done.error}))
        if self._metrics is not None:
            self._metrics.retries.labels(cycle.definition.name).inc()

    async def _take_limits(
        self,
        cycle: _Cycle,
        frame: Frame,
        step: EffectStep,
        occurrence: str,
        names: tuple[str, ...],
    ) -> _Attempt | None:
        """Take the step's downstream limits (docs/limits.md) before its intent and call.

        Evidence not yet written (a finished step's) is committed first: it releases that
        step's slots, which this task would otherwise count against itself.

        Returns:
            None once every limit is taken; else an attempt of kind ``deferred`` whose
            ``result`` is the :class:`~toolkit.limits.LimitDeferral` (nothing was taken).
        """
        cp = cycle.checkpoint
        task = cycle.task
        wait = cp.wait if frame is cp and cp.wait and cp.wait.get("limit") else None
        if wait is not None and wait.get("occurrence") != occurrence:
            wait = None
        if cycle.dirty:
            await self._commit(cycle)
        taken = await self._retrying(
            cycle.control,
            functools.partial(
                self._limits.acquire, self._worker_id, task.id, task.token, task.tenant,
                occurrence, names, (wait or {}).get("deferrals", 0),
            ),
        )  # fmt: skip
        metrics = self._metrics
        if isinstance(taken, LimitDeferral):
            if metrics is not None:
                metrics.limit_deferrals.labels(cycle.definition.name, taken.name).inc()
            return _Attempt("deferred", occurrence, result=taken)
        if wait is not None:
            cp.wait = None
            since = wait.get("since")
            if metrics is not None and since:
                waited = (taken.now - datetime.datetime.fromisoformat(since)).total_seconds()
                metrics.limit_wait.labels(cycle.definition.name, wait["limit"]).observe(
                    max(waited, 0.0)
                )
        return None

    async def _limit_deferred(
        self, cycle: _Cycle, step: EffectStep, done: _Attempt
    ) -> CycleOutcome:
        """A limit of the step is full: wait (reason ``limit``) without the lease until then.

        The checkpoint's ``wait`` keeps the limit, its scope, the deferrals in a row and the
        first deferral's time (database time, for the wait metric).
        """
        deferral: LimitDeferral = done.result
        cp = cycle.checkpoint
        previous = cp.wait if cp.wait and cp.wait.get("limit") else {}
        if previous.get("occurrence") != done.occurrence:
            previous = {}
        until = deferral.until.isoformat()
        cp.wait = {
            "occurrence": done.occurrence, "limit": deferral.name, "scope": deferral.scope,
            "deferrals": previous.get("deferrals", 0) + 1,
            "since": previous.get("since") or deferral.now.isoformat(),
        }  # fmt: skip
        cycle.events.append(
            Event("limit_deferred", {"step": step.id, "limit": deferral.name,
                                     "reason": deferral.reason, "until": until})
        )  # fmt: skip
        await self._commit(cycle, state="waiting", wait_reason="limit", run_at=until)
        return CycleOutcome.WAITING

    async def _attempt(
        self,
        cycle: _Cycle,
        frame: Frame,
        step: EffectStep,
        control: CycleControl,
        scope: dict[str, Any],
        spend_limits: Callable[[], SpendLimits],
        charge: Callable[[dict[str, float]], None],
        args: Any = None,
    ) -> _Attempt:
        """One attempt at an effect in ``frame`` (the task's graph or a branch's).

        Records the intent (not idempotent), calls the handler, appends the evidence with
        what the call spent, and charges the spend (``charge``). ``spend_limits`` caps the spend
        by resource: read at each report, less what other calls of the cycle have in
        flight. An intent found without outcome is applied from the operator's
        resolution, or reported ``reconcile``. For a step with ``callback``, the handler's
        return is followed by the callback's completion (kind ``callback`` while it has not
        come). ``args``, when given, are used as they are instead of rendering the step's
        (a compensation's, rendered when its step completed).
        """
        cp = cycle.checkpoint
        task = cycle.task
        occurrence = frame.occurrence(step.id)
        key = f"{task.id}:{occurrence}"
        callback = cp.callbacks.get(occurrence) if step.callback is not None else None
        if callback is not None and callback["called"]:
            return await self._callback_outcome(cycle, frame, step, occurrence, scope)
        if frame.pending == occurrence:
            resolution = cp.resolution
            if resolution is None or resolution.get("occurrence") != occurrence:
                # Intent recorded, outcome unknown, not idempotent: fail closed (DESIGN §2).
                return _Attempt("reconcile", occurrence)
            cp.resolution = None
            frame.pending = None
            if resolution["outcome"] == "completed":
                frame.attempts.pop(occurrence, None)
                self._compensable(cycle, step, occurrence, scope, resolution["result"])
                return _Attempt("completed", occurrence, result=resolution["result"])
            if resolution["outcome"] == "failed":
                attempt = frame.attempts.get(occurrence, 1)
                return _Attempt("failed", occurrence, attempt, error=resolution["error"])
            # "retry": call again below, with a new intent record and the same key.
        handler = self._app.handler(step.handler)
        limits = self._app.step_limits(step)
        if limits:  # downstream limits: taken before the intent, released with the evidence
            deferred = await self._take_limits(cycle, frame, step, occurrence, limits)
            if deferred is not None:
                return deferred
        attempt = frame.attempts.get(occurrence, 0) + 1
        if args is None:
            context = {**scope["context"], "attempt": attempt}
            args = step.args.render({**scope, "context": context})
        meter = SpendMeter(spend_limits, cycle.spend_ledger)

        def record(kind: Any, result: Any = None, error: Any = None) -> EvidenceRecord:
            spend = dict(meter.spent) or None
            if kind != "started":
                meter.settle(charge)
            return EvidenceRecord(
                occurrence=occurrence, step=step.id, handler=step.handler,
                idempotent=step.idempotent, idempotency_key=key, record=kind,
                attempt=attempt, result=result, error=error,
                spend=None if kind == "started" else spend,
            )  # fmt: skip

        if faults.ARMED:
            faults.fault_point("before_intent", step.id)
        if not step.idempotent:
            # The intent carries the attempt; a takeover finds it pending and reconciles.
            frame.attempts[occurrence] = attempt
            cycle.evidence.append(record("started"))
            frame.pending = occurrence
        token = None
        if step.callback is not None:  # registered before the call: an early completion is kept
            token = new_token()
            cp.callbacks[occurrence] = {"token": token, "attempt": attempt, "called": False}
            frame.attempts[occurrence] = attempt
            if cycle.dirty:
                await self._commit(cycle)
            await self._retrying(
                control,
                functools.partial(
                    self._callbacks.create, self._worker_id, task.id, task.token, occurrence,
                    attempt, token,
                ),
            )  # fmt: skip
        if cycle.dirty:
            await self._commit(cycle)
        # An idempotent attempt is not written before the call: a takeover counts it as lost.
        frame.attempts[occurrence] = attempt
        if faults.ARMED:
            faults.fault_point("after_intent", step.id)

        ctx = EffectContext(
            task_id=task.id,
            tenant=task.tenant,
            workflow=(cycle.definition.name, cycle.definition.version),
            step=step.id,
            occurrence=occurrence,
            attempt=attempt,
            fencing_token=task.token,
            idempotency_key=key,
            _connection=self._connection,
            _stop=control.new_call(),
            _spend=meter,
            callback_token=token,
        )
        started = time.monotonic()
        outcome = "error"
        try:
            result = await self._call(handler, step, ctx, args)
            outcome = "completed"
        except (ResultNotJson, ResultTooLarge) as exc:
            # The call happened; its result cannot be recorded. Not an attempt to repeat:
            # the step fails for good (its catch applies).
            error = error_data(exc)
            frame.pending = None
            cp.callbacks.pop(occurrence, None)
            cycle.evidence.append(record("failed", error=error))
            return _Attempt("failed", occurrence, attempt, error=error, final=True)
        except _TimedOut:
            error = {"name": "Timeout", "message": f"step {step.id!r} ran past {step.timeout:g} s"}
            if not step.idempotent:
                # The call may or may not have had its effect: uncertain, so reconcile.
                meter.settle()
                return _Attempt("reconcile", occurrence, attempt, error=error)
            cp.callbacks.pop(occurrence, None)
            cycle.evidence.append(record("failed", error=error))
            return _Attempt("failed", occurrence, attempt, error=error)
        except Exception as exc:  # a handler's error is data: it goes to the retry policy
            error = error_data(exc)
            frame.pending = None
            cp.callbacks.pop(occurrence, None)
            cycle.evidence.append(record("failed", error=error))
            return _Attempt(
                "failed", occurrence, attempt, error=error, final=error["name"] in NEVER_RETRIED
            )
        except BaseException:  # cancelled: no evidence, so its spend is not charged
            meter.settle()
            raise
        finally:
            if self._metrics is not None:
                self._metrics.step_duration.labels(cycle.definition.name, step.id, outcome).observe(
                    time.monotonic() - started
                )
        if faults.ARMED:
            faults.fault_point("after_call", step.id)
        frame.pending = None
        if token is not None:
            # The handler handed the token out; the step's outcome is the completion's.
            cp.callbacks[occurrence]["called"] = True
            cycle.evidence.append(record("completed", result={"callback": token,
                                                              "handler": result}))  # fmt: skip
            return await self._callback_outcome(cycle, frame, step, occurrence, scope)
        frame.attempts.pop(occurrence, None)
        cycle.evidence.append(record("completed", result=result))
        self._compensable(cycle, step, occurrence, scope, result)
        return _Attempt("completed", occurrence, attempt, result=result)

    def _compensable(
        self, cycle: _Cycle, step: EffectStep, occurrence: str, scope: dict[str, Any], result: Any
    ) -> None:
        """Remember how to undo a completed effect, with its arguments rendered now."""
        if step.compensate is None:
            return
        steps = {**scope["steps"], step.id: result}
        cycle.checkpoint.compensable.append(
            {
                "step": step.id,
                "occurrence": occurrence,
                "handler": step.compensate.handler,
                "idempotent": step.compensate.idempotent,
                "args": step.compensate.args.render({**scope, "steps": steps}),
            }
        )

    # --- callbacks ----------------------------------------------------------------------------

    async def _callback_outcome(
        self, cycle: _Cycle, frame: Frame, step: EffectStep, occurrence: str,
        scope: dict[str, Any],
    ) -> _Attempt:  # fmt: skip
        """What the callback of a called attempt came to: completed, failed, or not yet.

        A task claimed again while it waits for a callback that has not come was claimed
        at the callback's timeout: the token expires and the attempt fails with ``Timeout``.
        """
        cp = cycle.checkpoint
        callback = cp.callbacks[occurrence]
        attempt = int(callback["attempt"])
        record = await self._retrying(
            cycle.control, functools.partial(self._callbacks.get, callback["token"])
        )
        if record is not None and record.state == "completed":
            cp.callbacks.pop(occurrence)
            cp.wait = None
            if record.error is not None:
                error = {"name": str(record.error.get("name", "CallbackFailed")),
                         "message": str(record.error.get("message", ""))}  # fmt: skip
                return _Attempt("failed", occurrence, attempt, error=error)
            frame.attempts.pop(occurrence, None)
            self._compensable(cycle, step, occurrence, scope, record.result)
            return _Attempt("completed", occurrence, attempt, result=record.result)
        waiting = cp.wait is not None and cp.wait.get("callback") == callback["token"]
        if waiting or record is None or record.state == "expired":
            await self._retrying(
                cycle.control, functools.partial(self._callbacks.expire, callback["token"])
            )
            cp.callbacks.pop(occurrence)
            cp.wait = None
            assert step.callback is not None
            timeout = step.callback.timeout
            message = f"no completion of the callback of step {step.id!r}" + (
                f" within {timeout:g} s" if timeout is not None else "")
            return _Attempt("failed", occurrence, attempt, error={"name": "Timeout",
                                                                  "message": message})
        return _Attempt("callback", occurrence, attempt)

    async def _await_callback(
        self, cycle: _Cycle, step: EffectStep, occurrence: str
    ) -> CycleOutcome:
        """Wait without a lease for the callback of ``occurrence`` (or its timeout)."""
        cp = cycle.checkpoint
        token = cp.callbacks[occurrence]["token"]
        cp.wait = {"occurrence": occurrence, "callback": token}
        cycle.events.append(Event("waiting", {"step": step.id, "callback": True}))
        assert step.callback is not None
        if step.callback.timeout is None:
            await self._commit(cycle, state="waiting", wait_reason="callback", run_at=NEVER)
        else:
            await self._commit(
                cycle, state="waiting", wait_reason="callback",
                delay_seconds=step.callback.timeout,
            )  # fmt: skip
        return CycleOutcome.WAITING

    # --- compensation -------------------------------------------------------------------------

    async def _compensate(self, cycle: _Cycle, control: CycleControl) -> CycleOutcome:
        """Run the compensations of the completed effects, newest first, then end failed.

        Each is an effect with its own evidence and idempotency key
        (``compensate/<occurrence>/<step>#1``); each one's end is committed before the next
        starts, so a crash resumes the compensation in progress and never repeats a finished
        one. A compensation that fails for good is recorded and the others still run.
        """
        cp = cycle.checkpoint
        state = cp.compensating
        assert state is not None
        if cp.pending is not None and cp.pending.startswith("compensate/"):
            cp.pending = None  # the compensation's frame keeps its own pending occurrence
        first = True
        while cp.compensable:
            entry = cp.compensable[-1]
            prefix = f"compensate/{entry['occurrence']}/"
            stored = state.get("frame")
            frame = (
                BranchFrame.from_json(stored)
                if stored is not None and stored["prefix"] == prefix
                else BranchFrame.start(entry["step"], prefix)
            )
            cycle.compensation = frame
            step = EffectStep(
                id=entry["step"], handler=entry["handler"], idempotent=entry["idempotent"],
                args=_NO_ARGS, retry=RetryPolicy(), timeout=None, next=None,
            )  # fmt: skip
            if first and cycle.task.recovered:
                _lost_attempt(cycle, frame, step)
            first = False
            done = await self._attempt(
                cycle, frame, step, control, cycle.scope(), dict, cycle.charge, entry["args"]
            )
            if done.kind == "reconcile":
                return await self._reconcile(cycle, step, done.occurrence, done.error)
            if done.kind == "deferred":
                return await self._limit_deferred(cycle, step, done)
            if done.kind == "failed":
                delay = _retry_delay(step, done)
                if delay is not None:
                    self._retry_scheduled(cycle, step, done, delay)
                    await self._commit(cycle, state="queued", delay_seconds=delay)
                    return CycleOutcome.RETRY
            outcome = {"step": entry["step"], "occurrence": entry["occurrence"],
                       "handler": entry["handler"], "outcome": done.kind}  # fmt: skip
            if done.kind == "completed":
                outcome["result"] = done.result
            else:
                outcome["error"] = done.error
            state["outcomes"].append(outcome)
            cp.compensable.pop()
            cycle.compensation = None
            state.pop("frame", None)
            cycle.events.append(Event("compensated", outcome))
            await self._commit(cycle)
        outcomes = state["outcomes"]
        ok = all(item["outcome"] == "completed" for item in outcomes)
        error = {**state["error"], "compensation": "completed" if ok else "failed"}
        cp.compensating = None
        cp.cursor = None
        cycle.events.append(Event("failed", {"error": error}))
        await self._commit(cycle, state="failed", error=error, result={"compensations": outcomes})
        return CycleOutcome.FAILED

    # --- the workflow deadline ----------------------------------------------------------------

    async def _deadline_passed(self, cycle: _Cycle) -> CycleOutcome | None:
        """The workflow deadline has passed: go to ``on_timeout``, else fail with ``Timeout``.

        What was in progress is abandoned as a cancellation abandons it: a wait ends, a child
        is cancelled, a parallel or map step's reservation is released, an effect's recorded
        intent stays in the evidence without an outcome.

        Returns:
            None when the task goes on at ``on_timeout`` in this cycle, else how it ended.
        """
        cp = cycle.checkpoint
        step = cp.cursor
        error = {"name": "Timeout", "message": "the workflow deadline passed", "step": step}
        if cp.fanout is not None:
            self._release(cycle, cp.fanout)
            cp.fanout = None
        if cp.wait is not None and "child" in cp.wait:
            try:
                await self._retrying(
                    cycle.control,
                    functools.partial(self._tasks.cancel, cp.wait["child"], "parent timed out"),
                )
            except TaskTerminal:
                pass  # it ended meanwhile
        cp.wait = None
        cp.pending = None
        cp.callbacks.clear()
        cycle.events.append(Event("deadline_passed", {"step": step}))
        target = cycle.definition.on_timeout
        if target is None:
            return await self._fail(cycle, error)
        if step is not None:
            cp.outputs[step] = {"error": error}
        cp.enter(target)
        cycle.clear_deadline = True
        return None

    async def _reconcile(
        self, cycle: _Cycle, step: _NextStep, occurrence: str, error: Error | None = None
    ) -> CycleOutcome:
        cycle.checkpoint.pending = occurrence
        detail: dict[str, Any] = {"step": step.id, "occurrence": occurrence}
        if error is not None:
            detail["error"] = error
        cycle.events.append(Event("reconciliation_required", detail))
        await self._commit(cycle, state="waiting", wait_reason="reconciliation", run_at=NEVER)
        return CycleOutcome.WAITING

    async def _call(self, handler: Handler, step: EffectStep, ctx: EffectContext, args: Any) -> Any:
        if step.timeout is None:  # the common case: no cancel scope of its own (hot path)
            result = await self._invoke(handler, ctx, args)
        else:
            with anyio.move_on_after(step.timeout) as scope:
                result = await self._invoke(handler, ctx, args)
            if scope.cancelled_caught:
                ctx._stop.set()
                raise _TimedOut
        self._check_result(result, step.id, f"handler {step.handler!r}")
        return result

    @staticmethod
    async def _invoke(handler: Handler, ctx: EffectContext, args: Any) -> Any:
        """Call a handler: async ones on the loop, sync ones in a worker thread."""
        if handler.is_async:
            return await handler.call(ctx, args)
        return await anyio.to_thread.run_sync(
            functools.partial(handler.call, ctx, args), abandon_on_cancel=True
        )

    def _check_result(self, value: Any, step: str, source: str) -> None:
        """Check that a step's result can be stored within the payload limits.

        Raises:
            ResultTooLarge: over the size or nesting limit.
            ResultNotJson: not storable JSON (a non-JSON type, NaN, a NUL character ...).
        """
        try:
            check_payload(value, self._leases.payload_limits)
        except PayloadRefused as exc:
            where = f"{source} of step {step!r} returned a value"
            if exc.limit is not None:
                raise ResultTooLarge(
                    f"{where} over the payload limit: {exc}", step=step, path=exc.path,
                    limit=exc.limit,
                ) from exc  # fmt: skip
            raise ResultNotJson(f"{where} that cannot be stored as JSON: {exc}") from exc

    # --- parallel and map -------------------------------------------------------------------

    async def _fanout(
        self, cycle: _Cycle, step: ParallelStep | MapStep, control: CycleControl
    ) -> CycleOutcome | None:
        """Run a parallel or map step: its branches concurrently inside this lease.

        Each branch's progress is committed as it happens (its frame is in the checkpoint),
        so a crash resumes every branch where it was and never re-runs a finished one. A race
        winner is committed before anything else happens. Reservations are taken before any
        branch starts and released when the step ends.
        """
        cp = cycle.checkpoint
        occurrence = cp.occurrence(step.id)
        scope = cycle.scope()
        items: list[Any] | None = None
        if isinstance(step, MapStep):
            rendered = step.items.render(scope)
            if not isinstance(rendered, list):
                raise ExpressionError(
                    f"step {step.id!r}: map items must be a list, got {json_type(rendered)}",
                    step=step.id,
                )
            items = rendered
            names = [str(index) for index in range(len(items))]
        else:
            names = list(step.branches)
        fan = cp.fanout
        if fan is None or fan.get("occurrence") != occurrence:
            fan = {"occurrence": occurrence, "branches": {}, "winner": None, "reserved": None,
                   "spent": {}}  # fmt: skip
            cp.fanout = fan
            cycle.events.append(Event("fanout_started", {"step": step.id, "branches": len(names)}))
        if step.reserve is not None and fan["reserved"] is None:
            outcome = await self._reserve(cycle, step, fan, len(names))
            if outcome is not None or cp.fanout is None:
                return outcome
        cycle.frames = {
            name: BranchFrame.from_json(data) for name, data in fan["branches"].items()
        }
        run = _FanOut(self, cycle, step, fan, names, items, control)
        try:
            run.resume()
            await run.run_branches()
            return await self._end_fanout(run)
        finally:
            cycle.frames = {}

    async def _end_fanout(self, run: _FanOut) -> CycleOutcome | None:
        cycle, step, fan = run.cycle, run.step, run.fan
        cp = cycle.checkpoint
        frames = cycle.frames
        for name, frame in frames.items():
            if frame.status == "running":  # stopped by cancel_losers
                frame.status = "cancelled"
                cycle.events.append(
                    Event("branch_cancelled", {"step": step.id, "branch": name,
                                               "pending": frame.pending})
                )  # fmt: skip
        winner = fan.get("winner")
        blocked = [frame for frame in frames.values() if frame.status == "blocked"]
        output: Any = None
        error: Error | None = None
        if run.racing and winner is not None:
            output = frames[winner].output
        elif not run.racing and run.failure is not None:
            name, branch_error = run.failure
            error = {**branch_error, "branch": name}
        elif blocked:  # undecided while an effect's outcome is unknown: reconcile first
            pending = blocked[0].pending
            assert pending is not None
            return await self._reconcile(cycle, step, pending)
        elif run.racing:
            errors = {name: frame.error for name, frame in frames.items()}
            error = {"name": "AllBranchesFailed", "errors": errors,
                     "message": f"every branch of step {step.id!r} failed"}  # fmt: skip
        else:
            outputs = [frames[name].output for name in run.names]
            mapped = isinstance(step, MapStep)
            output = outputs if mapped else dict(zip(run.names, outputs, strict=True))
        self._release(cycle, fan)
        cp.fanout = None
        cycle.frames = {}
        detail: dict[str, Any] = {"step": step.id, "outcome": "failed" if error else "succeeded"}
        if winner is not None:
            detail["winner"] = winner
        cycle.events.append(Event("fanout_ended", detail))
        if error is not None:
            return await self._step_failed(cycle, step, error)
        self._check_result(output, step.id, "the branches")
        return await self._advance(cycle, step, output)

    async def _reserve(
        self, cycle: _Cycle, step: ParallelStep | MapStep, fan: dict[str, Any], branches: int
    ) -> CycleOutcome | None:
        """Take the step's reservation from the task's and the tenant's budgets.

        Returns:
            None once reserved; WAITING when it does not fit now (the task waits, reason
            ``budget``, and looks again later); else the outcome of failing the step with
            ``BudgetExceeded`` (it can never fit).
        """
        assert step.reserve is not None
        cp = cycle.checkpoint
        factor = branches if step.reserve.per_branch else 1
        amounts = {res: float(amount) * factor for res, amount in step.reserve.amounts.items()}
        for resource, amount in amounts.items():
            entry = cp.budget.get(resource)
            if entry is not None and amount > entry["limit"] - entry["spent"] + 1e-9:
                left = entry["limit"] - entry["spent"]
                return await self._budget_refused(cycle, step, resource, amount, left, "task")
        if cycle.dirty:
            await self._commit(cycle)  # the reservation's own write carries no evidence
        fan["reserved"] = amounts
        for resource, amount in amounts.items():
            if resource in cp.budget:
                cp.budget[resource]["reserved"] += amount
        deferrals = (cp.wait or {}).get("budget", 0)
        cp.wait = None
        reservation: tuple[ReservationOutcome, str | None]
        async with cycle.lock:
            reservation = await self._retrying(
                cycle.control,
                functools.partial(
                    self._budgets.reserve, self._worker_id, cycle.task.id, cycle.task.token,
                    cycle.task.tenant, amounts, cycle.checkpoint_json(), cycle.next_write_id(),
                    {"step": step.id, "amounts": amounts},
                ),
            )  # fmt: skip
        outcome, short = reservation
        if outcome is ReservationOutcome.RESERVED:
            return None
        fan["reserved"] = None
        for name, amount in amounts.items():
            if name in cp.budget:
                cp.budget[name]["reserved"] -= amount
        assert short is not None
        if outcome is ReservationOutcome.NEVER:
            return await self._budget_refused(cycle, step, short, amounts[short], None, "tenant")
        delay = min(BUDGET_RECHECK_MAX, 2.0 ** min(deferrals + 1, 6))
        cp.wait = {"occurrence": fan["occurrence"], "budget": deferrals + 1}
        cycle.events.append(
            Event("budget_deferred", {"step": step.id, "resource": short,
                                      "amount": amounts[short], "delay_seconds": delay})
        )  # fmt: skip
        await self._commit(cycle, state="waiting", wait_reason="budget", delay_seconds=delay)
        return CycleOutcome.WAITING

    async def _budget_refused(
        self,
        cycle: _Cycle,
        step: ParallelStep | MapStep,
        resource: str,
        amount: float,
        left: float | None,
        whose: str,
    ) -> CycleOutcome | None:
        cycle.checkpoint.fanout = None
        cycle.checkpoint.wait = None
        where = f"{left:g} left in the task's budget" if left is not None else (
            "more than the tenant's budget has left, its reservations returned")
        message = f"step {step.id!r} reserves {amount:g} {resource}: {where}"
        error = {"name": "BudgetExceeded", "message": message, "resource": resource,
                 "budget": whose}  # fmt: skip
        return await self._step_failed(cycle, step, error)

    @staticmethod
    def _release(cycle: _Cycle, fan: dict[str, Any]) -> None:
        """Return what the step reserved and did not spend; move its spend to the task's."""
        reserved = fan.get("reserved") or {}
        cp = cycle.checkpoint
        for resource, amount in reserved.items():
            used = fan["spent"].get(resource, 0.0)
            if resource in cp.budget:
                cp.budget[resource]["reserved"] -= amount
                cp.budget[resource]["spent"] += used
            unspent = amount - used
            if unspent:
                cycle.budget_delta[resource] = cycle.budget_delta.get(resource, 0.0) - unspent
            cycle.budget_released[resource] = cycle.budget_released.get(resource, 0.0) + amount
        fan["reserved"] = None

    # --- child workflows --------------------------------------------------------------------

    async def _child(
        self, cycle: _Cycle, step: WorkflowStep, control: CycleControl
    ) -> CycleOutcome | None:
        """Start the step's child task once, then wait for it without a lease."""
        cp = cycle.checkpoint
        task = cycle.task
        occurrence = cp.occurrence(step.id)
        child = await self._retrying(
            control, functools.partial(self._children.get, task.id, occurrence)
        )
        if child is None:
            try:
                definition = await self._retrying(
                    control,
                    functools.partial(self._catalog.submittable, step.workflow, step.version),
                )
                child_input = definition.validate_input(step.input.render(cycle.scope()))
                check_payload(child_input, self._leases.payload_limits)
            except (UnknownDefinition, DefinitionRetired, InputError, PayloadRefused) as exc:
                return await self._step_failed(cycle, step, error_data(exc))
            if cycle.dirty:
                await self._commit(cycle)
            child = await self._retrying(
                control,
                functools.partial(
                    self._children.start, self._worker_id, task.id, task.token, occurrence,
                    definition, child_input,
                ),
            )  # fmt: skip
            cycle.events.append(
                Event("child_started", {"step": step.id, "child_id": child.id,
                                        "workflow": child.name, "version": child.version})
            )  # fmt: skip
        if child.ended:
            cp.wait = None
            if child.state == "succeeded":
                return await self._advance(cycle, step, child.result)
            error = dict(child.error or {})
            if child.state == "cancelled":
                error["name"] = "ChildCancelled"
            error.setdefault("name", "ChildFailed")
            error.setdefault("message", f"child task {child.id} {child.state}")
            return await self._step_failed(cycle, step, {**error, "child_id": child.id})
        cp.wait = {"occurrence": occurrence, "child": child.id}
        cycle.events.append(Event("waiting", {"step": step.id, "child": child.id}))
        await self._commit(cycle, state="waiting", wait_reason="child", run_at=NEVER)
        return CycleOutcome.WAITING

    # --- waits --------------------------------------------------------------------------------

    async def _wait(self, cycle: _Cycle, step: WaitStep) -> CycleOutcome | None:
        if step.any:
            return await self._wait_any(cycle, step)
        cp = cycle.checkpoint
        occurrence = cp.occurrence(step.id)
        resumed = cp.wait is not None and cp.wait.get("occurrence") == occurrence
        if step.signal is not None:
            found = await self._take_signal(cycle, [step.signal], occurrence)
            if found is not None:
                cp.wait = None
                return await self._advance(cycle, step, found[1])
            if resumed:  # claimed with no signal stored: the wait's deadline passed
                cp.wait = None
                message = f"no signal {step.signal!r} within {step.timeout:g} s"
                return await self._step_failed(cycle, step, {"name": "Timeout", "message": message})
            cp.wait = {"occurrence": occurrence, "signal": step.signal}
            cycle.events.append(Event("waiting", {"step": step.id, "signal": step.signal}))
            if step.timeout is None:
                await self._commit(cycle, state="waiting", wait_reason="signal", run_at=NEVER)
            else:
                await self._commit(
                    cycle, state="waiting", wait_reason="signal", delay_seconds=step.timeout
                )
            return CycleOutcome.WAITING
        if resumed:  # a timer wait is only claimed again once its run_at has passed
            cp.wait = None
            return await self._advance(cycle, step, None)
        cp.wait = {"occurrence": occurrence, "timer": True}
        cycle.events.append(Event("waiting", {"step": step.id, "timer": True}))
        if step.until is not None:
            until = _timestamp(step.until.render(cycle.scope()), step.id)
            await self._commit(cycle, state="waiting", wait_reason="timer", run_at=until)
        else:
            await self._commit(
                cycle, state="waiting", wait_reason="timer", delay_seconds=step.duration
            )
        return CycleOutcome.WAITING

    async def _take_signal(
        self, cycle: _Cycle, names: list[str], occurrence: str
    ) -> tuple[str, Any] | None:
        """Take the oldest stored signal of ``names`` for ``occurrence``: ``(name, payload)``.

        Only the signal taken is consumed, by the cycle's next fenced write.
        """
        taken = [signal_id for signal_id, _ in cycle.signals]
        found = await self._retrying(
            cycle.control,
            functools.partial(self._leases.next_signal, cycle.task.id, names, taken),
        )
        if found is None:
            return None
        signal_id, name, payload = found
        cycle.signals.append((signal_id, occurrence))
        return name, payload

    async def _wait_any(self, cycle: _Cycle, step: WaitStep) -> CycleOutcome | None:
        """``wait: {any: [...]}``: the first of several signals and timers decides where to go.

        Only the winning signal is consumed. The timers' deadline is fixed when the wait
        starts (database time) and kept in the checkpoint; a claim without a signal stored
        is that deadline passing.
        """
        cp = cycle.checkpoint
        occurrence = cp.occurrence(step.id)
        resumed = cp.wait is not None and cp.wait.get("occurrence") == occurrence
        names = [event.signal for event in step.any if event.signal is not None]
        found = await self._take_signal(cycle, names, occurrence) if names else None
        if found is not None:
            name, payload = found
            target = next(event.next for event in step.any if event.signal == name)
            cp.wait = None
            return await self._route(cycle, step, {"event": name, "payload": payload}, target)
        timers = [event for event in step.any if event.signal is None]
        if resumed and timers:
            index = (cp.wait or {}).get("timer", 0)
            cp.wait = None
            return await self._route(cycle, step, {"event": "timer"}, timers[index].next)
        cp.wait = {"occurrence": occurrence, "signals": names, "any": True}
        run_at = NEVER
        if timers:  # each timer as a moment in database time; the earliest is the deadline
            now = await self._retrying(cycle.control, self._leases.database_now)
            moments = [
                datetime.datetime.fromisoformat(_timestamp(event.until.render(cycle.scope()),
                                                           step.id))
                if event.until is not None
                else now + datetime.timedelta(seconds=event.duration or 0)
                for event in timers
            ]  # fmt: skip
            index = min(range(len(timers)), key=moments.__getitem__)
            cp.wait["timer"] = index
            run_at = moments[index].isoformat()
        until = None if run_at == NEVER else run_at
        reason = "signal" if names else "timer"
        cycle.events.append(
            Event("waiting", {"step": step.id, "signals": names, "until": until, "reason": reason})
        )
        await self._commit(cycle, state="waiting", wait_reason=reason, run_at=run_at)
        return CycleOutcome.WAITING

    async def _route(
        self, cycle: _Cycle, step: WaitStep, output: Any, target: str
    ) -> CycleOutcome | None:
        """Record a step's output and go to ``target``."""
        cycle.checkpoint.outputs[step.id] = output
        cycle.checkpoint.enter(target)
        return None

    # --- terminal writes ----------------------------------------------------------------------

    async def _succeed(self, cycle: _Cycle, result: Any) -> CycleOutcome:
        cycle.checkpoint.enter(None)
        cycle.events.append(Event("succeeded"))
        await self._commit(cycle, state="succeeded", result=result)
        return CycleOutcome.SUCCEEDED

    async def _fail(self, cycle: _Cycle, error: Error, compensate: bool = True) -> CycleOutcome:
        """Fail the task, after compensating its completed effects when it has any.

        ``compensate`` is False for a ``fail`` step without ``compensate: true``.
        """
        error.setdefault("step", cycle.checkpoint.cursor)
        if isinstance(error.get("message"), str):
            error["message"] = storable_text(error["message"])
        cp = cycle.checkpoint
        if compensate and cp.compensable and cp.compensating is None:
            cp.compensating = {"error": error, "outcomes": []}
            steps = [entry["occurrence"] for entry in reversed(cp.compensable)]
            cycle.events.append(Event("compensating", {"error": error, "compensate": steps}))
            return await self._compensate(cycle, cycle.control)
        cycle.checkpoint.cursor = None
        cycle.events.append(Event("failed", {"error": error}))
        await self._commit(cycle, state="failed", error=error)
        return CycleOutcome.FAILED

    async def _cancel(self, cycle: _Cycle, request: Any) -> CycleOutcome:
        reason = request.get("reason") if isinstance(request, dict) else None
        error = {"name": "Cancelled", "message": reason or "cancelled by request"}
        error["step"] = cycle.checkpoint.cursor
        if cycle.checkpoint.fanout is not None:  # its reservation returns, its budget says so
            self._release(cycle, cycle.checkpoint.fanout)
        cycle.events.append(Event("cancelled", {"reason": error["message"]}))
        await self._commit(cycle, state="cancelled", error=error)
        return CycleOutcome.CANCELLED


def _timestamp(value: Any, step: str) -> str:
    """Check that ``value`` is an ISO-8601 timestamp with a UTC offset; return it."""
    try:
        parsed = datetime.datetime.fromisoformat(str(value))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ExpressionError(
            f"step {step!r}: wait until {value!r} is not an ISO-8601 timestamp with a UTC offset",
            step=step,
        )
    return parsed.isoformat()


class _TimedOut(Exception):
    """The step's timeout passed before the handler returned."""


_NextStep = EffectStep | WaitStep | ParallelStep | MapStep | WorkflowStep | SetStep
"""A step with ``next`` (and, but for a set step, ``catch``)."""

_CatchingStep = EffectStep | WaitStep | ParallelStep | MapStep | WorkflowStep
"""A step with ``catch``."""

_NO_ARGS = compile_template(None)
"""The arguments of a step built by the engine (a compensation's are passed as they are)."""


def _retry_delay(step: EffectStep, done: _Attempt) -> float | None:
    """Seconds before the next attempt after a failed one, or None: the step fails for good."""
    assert done.error is not None
    name = done.error["name"]
    policy = step.retry_policy(name)
    if done.final or policy is None or name in NEVER_RETRIED:
        return None
    if not policy.unlimited and done.attempt >= policy.max_attempts:
        return None
    return policy.delay(done.attempt)


def _lost_attempt(cycle: _Cycle, frame: Frame, step: EffectStep) -> Error | None:
    """Count the attempt a takeover found lost at ``step`` of ``frame``.

    Returns:
        The error failing the step once the lost attempts reach ``max_attempts``, else None.
        Nothing is counted when the intent is recorded: reconciliation decides then.
    """
    occurrence = frame.occurrence(step.id)
    if frame.pending == occurrence:
        return None
    frame.attempts[occurrence] = frame.attempts.get(occurrence, 0) + 1
    cycle.events.append(Event("attempt_lost", {"step": step.id, "occurrence": occurrence}))
    if frame.attempts[occurrence] < step.retry.max_attempts:
        return None
    frame.attempts.pop(occurrence)
    lost = step.retry.max_attempts
    message = f"step {step.id!r}: {lost} attempts were lost to crashes or expired leases"
    return {"name": "AttemptsExhausted", "message": message, "attempts": lost}


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception of a task group's that is not a cancellation, else the group."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = _first_error(exc)
        if not isinstance(exc, anyio.get_cancelled_exc_class() | BaseExceptionGroup):
            return exc
    return group


class _FanOut:
    """The branches of one parallel or map step occurrence, run inside one cycle."""

    def __init__(
        self,
        interpreter: Interpreter,
        cycle: _Cycle,
        step: ParallelStep | MapStep,
        fan: dict[str, Any],
        names: list[str],
        items: list[Any] | None,
        control: CycleControl,
    ) -> None:
        self.interpreter = interpreter
        self.cycle = cycle
        self.step = step
        self.fan = fan
        self.names = names
        self.items = items
        self.control = control
        #: (branch, error) of the first branch that failed (mode ``all`` and map).
        self.failure: tuple[str, Error] | None = None
        self.scope = anyio.CancelScope()
        #: Event-loop time each awaited callback began to be awaited, by token (one per
        #: attempt, so each attempt waits its whole timeout).
        self.callbacks_since: dict[str, float] = {}
        reserve = step.reserve
        self.reserved: Mapping[str, float] = reserve.amounts if reserve is not None else {}
        self.per_branch = reserve is not None and reserve.per_branch

    def branch(self, name: str) -> Branch:
        step = self.step
        return step.branch if isinstance(step, MapStep) else step.branches[name]

    def resume(self) -> None:
        """Bring stored branches back: apply a takeover's lost attempts, unblock resolved ones."""
        cycle = self.cycle
        cp = cycle.checkpoint
        if cp.pending is not None and cp.pending.startswith(f"{self.fan['occurrence']}/"):
            cp.pending = None  # the blocked branch keeps its own pending occurrence
        for name, frame in cycle.frames.items():
            if frame.status == "blocked":
                frame.status = "running"  # its effect finds the resolution, or blocks again
            if frame.status != "running" or not cycle.task.recovered or frame.cursor is None:
                continue
            inner = self.branch(name).steps[frame.cursor]
            if isinstance(inner, EffectStep):
                error = _lost_attempt(cycle, frame, inner)
                if error is not None:
                    self.step_failed(name, frame, inner, error)

    @property
    def decided(self) -> bool:
        """Whether the step's outcome is known (a race won, or a branch failed)."""
        return self.fan.get("winner") is not None or self.failure is not None

    async def run_branches(self) -> None:
        step = self.step
        limit = step.max_concurrency if isinstance(step, MapStep) else None
        slots = anyio.Semaphore(limit) if limit else None
        for name, frame in self.cycle.frames.items():
            if frame.status == "failed" and self.failure is None and not self.racing:
                self.failure = (name, frame.error or {})
        try:
            with self.scope:
                async with anyio.create_task_group() as group:
                    for name in self.names:
                        group.start_soon(self.run_one, name, slots)
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None

    @property
    def racing(self) -> bool:
        return isinstance(self.step, ParallelStep) and self.step.mode == "first_success"

    async def run_one(self, name: str, slots: anyio.Semaphore | None) -> None:
        if slots is None:
            await self.run_branch(name)
            return
        async with slots:
            await self.run_branch(name)

    async def run_branch(self, name: str) -> None:
        cycle = self.cycle
        frame = cycle.frames.get(name)
        if frame is None:
            if self.failure is not None:
                return  # a map item not started once the step has failed: never started
            frame = BranchFrame.start(self.branch(name).start, f"{self.fan['occurrence']}/{name}/")
            cycle.frames[name] = frame
        if frame.status != "running":
            return
        await self.steps(name, frame)
        await self.interpreter._commit(cycle)  # the branch's end is durable as it happens
        await self.ended(name, frame)

    async def ended(self, name: str, frame: BranchFrame) -> None:
        """Decide what a branch's end means for the step."""
        step = self.step
        if self.racing and frame.status == "succeeded" and self.fan.get("winner") is None:
            self.fan["winner"] = name
            self.cycle.events.append(Event("race_won", {"step": step.id, "branch": name}))
            await self.interpreter._commit(self.cycle)  # the winner is durable before all else
            if step.cancel_losers:
                self.scope.cancel()
        elif not self.racing and frame.status == "failed" and self.failure is None:
            self.failure = (name, frame.error or {})
            if step.cancel_losers:
                self.scope.cancel()

    def context(self, name: str) -> dict[str, Any]:
        if self.items is None:
            return {"branch": name}
        index = int(name)
        return {"branch": name, "index": index, "item": self.items[index]}

    def spend_limits(self, frame: BranchFrame) -> dict[str, tuple[Hashable, float]]:
        """What an effect of ``frame`` may spend: its reservation's rest, else the task's."""
        limits = self.cycle.spend_limits()
        for resource, amount in self.reserved.items():
            if self.per_branch:
                share = amount - frame.spent.get(resource, 0.0)
                limits[resource] = (("branch", id(frame), resource), share)
            else:
                total = self.fan["reserved"][resource]
                rest = total - self.fan["spent"].get(resource, 0.0)
                limits[resource] = (("reservation", resource), rest)
        return limits

    def charge(self, frame: BranchFrame, spend: dict[str, float]) -> None:
        """Charge a branch's spend: to the reservation when it covers the resource."""
        outside = {}
        for resource, amount in spend.items():
            frame.spent[resource] = frame.spent.get(resource, 0.0) + amount
            if resource in self.reserved:
                spent = self.fan["spent"]
                spent[resource] = spent.get(resource, 0.0) + amount
            else:
                outside[resource] = amount
        if outside:
            self.cycle.charge(outside)

    def step_failed(self, name: str, frame: BranchFrame, inner: Any, error: Error) -> None:
        """An inner step failed for good: its catch (within the branch), else the branch fails."""
        target = catch_target(getattr(inner, "catch", ()), error["name"])
        if target is None:
            frame.status = "failed"
            frame.error = {**error, "step": inner.id}
            frame.cursor = None
            self.cycle.events.append(
                Event("branch_failed", {"step": self.step.id, "branch": name, "error": frame.error})
            )
            return
        frame.outputs[inner.id] = {"error": error}
        self.cycle.events.append(
            Event("caught", {"step": inner.id, "branch": name, "error": error, "next": target})
        )
        self.enter(frame, target)

    def enter(self, frame: BranchFrame, target: str | None) -> None:
        frame.enter(target)
        self.cycle.checkpoint.steps_run += 1

    def succeed(self, name: str, frame: BranchFrame, output: Any) -> None:
        frame.status = "succeeded"
        frame.output = output
        frame.cursor = None
        self.cycle.events.append(Event("branch_succeeded", {"step": self.step.id, "branch": name}))

    async def steps(self, name: str, frame: BranchFrame) -> None:
        """Run the branch's steps until it ends or blocks on reconciliation."""
        interpreter, cycle = self.interpreter, self.cycle
        steps = self.branch(name).steps
        while frame.status == "running" and frame.cursor is not None:
            inner = steps[frame.cursor]
            scope = cycle.scope(frame, **self.context(name))
            if isinstance(inner, ChoiceStep):
                target = next(
                    (rule.next for rule in inner.choices if is_truthy(rule.when.render(scope))),
                    inner.default,
                )
                if target is None:
                    message = f"no choice of step {inner.id!r} matched"
                    self.step_failed(name, frame, inner, {"name": "NoChoiceMatched",
                                                          "message": message})  # fmt: skip
                else:
                    self.enter(frame, target)
                continue
            if isinstance(inner, SucceedStep):
                output = inner.output.render(scope)
                interpreter._check_result(output, inner.id, "the output")
                self.succeed(name, frame, output)
                continue
            if isinstance(inner, FailStep):
                message = inner.message.render(scope)
                text = message if isinstance(message, str) else json.dumps(message)
                self.step_failed(name, frame, inner, {"name": inner.error, "message": text})
                continue
            if isinstance(inner, SetStep):
                values = inner.values.render(scope)
                interpreter._check_result(values, inner.id, "the values")
                frame.outputs[inner.id] = values
                if inner.next is None:
                    self.succeed(name, frame, values)
                else:
                    self.enter(frame, inner.next)
                continue
            done = await interpreter._attempt(
                cycle, frame, inner, self.control, scope,
                functools.partial(self.spend_limits, frame), functools.partial(self.charge, frame),
            )  # fmt: skip
            if done.kind == "callback":  # no lease to release in a branch: look again soon
                assert inner.callback is not None
                token = cycle.checkpoint.callbacks[done.occurrence]["token"]
                since = self.callbacks_since.setdefault(token, anyio.current_time())
                timeout = inner.callback.timeout
                if timeout is None or anyio.current_time() - since < timeout:
                    await anyio.sleep(CALLBACK_POLL)
                    continue
                cycle.checkpoint.callbacks.pop(done.occurrence)
                await interpreter._retrying(
                    self.control, functools.partial(interpreter._callbacks.expire, token)
                )
                message = f"no completion of the callback of step {inner.id!r} within {timeout:g} s"
                done = _Attempt("failed", done.occurrence, done.attempt,
                                error={"name": "Timeout", "message": message})  # fmt: skip
            if done.kind == "completed":
                frame.outputs[inner.id] = done.result
                if inner.next is None:
                    self.succeed(name, frame, done.result)
                else:
                    self.enter(frame, inner.next)
            elif done.kind == "deferred":  # no lease to release in a branch: wait in it
                await anyio.sleep(min(done.result.delay_seconds, LIMIT_BRANCH_RECHECK))
            elif done.kind == "reconcile":
                frame.status = "blocked"
                frame.pending = done.occurrence
                detail: dict[str, Any] = {"step": inner.id, "occurrence": done.occurrence}
                if done.error is not None:
                    detail["error"] = done.error
                cycle.events.append(Event("reconciliation_required", detail))
                return
            else:
                assert done.error is not None
                delay = _retry_delay(inner, done)
                if delay is None:
                    frame.attempts.pop(done.occurrence, None)
                    self.step_failed(name, frame, inner, {**done.error, "attempts": done.attempt})
                    continue
                interpreter._retry_scheduled(cycle, inner, done, delay)
                await interpreter._commit(cycle)
                await anyio.sleep(delay)  # inside a branch, a retry keeps the lease
