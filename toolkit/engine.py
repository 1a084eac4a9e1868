"""The interpreter: resume a task from its checkpoint and run its steps (DESIGN §2, §4).

One call of :meth:`Interpreter.execute` is one claim-and-execute cycle for one task. Pure
steps (choice, succeed, fail) need no write of their own; the evidence of a finished effect
is committed together with whatever comes next (the next intent, the wait, or the terminal
state), always by one fenced statement.
"""

from __future__ import annotations

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
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import anyio
import psycopg

from toolkit import faults
from toolkit.checkpoint import Checkpoint
from toolkit.definition import (
    ChoiceStep,
    EffectStep,
    FailStep,
    SucceedStep,
    WaitStep,
    WorkflowDefinition,
    catch_target,
)
from toolkit.errors import (
    DatabaseUnavailable,
    ExpressionError,
    HandlerNotFound,
    LeaseLost,
    PayloadRefused,
    ResultNotJson,
    ResultTooLarge,
    StoreError,
)
from toolkit.expressions import is_truthy
from toolkit.leases import (
    NEVER,
    ClaimedTask,
    Event,
    EvidenceRecord,
    FencedWrite,
    Leases,
    TaskState,
)
from toolkit.metrics import WorkerMetrics
from toolkit.payload import check_payload
from toolkit.registry import App, EffectContext, Handler

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Most characters of an error message stored with a task or its evidence.
MAX_ERROR_MESSAGE = 4000
#: Backoff between two tries of a store call while the database is unreachable, seconds.
STORE_RETRY_MIN = 0.05
STORE_RETRY_MAX = 2.0

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
        self.cancelled_at_commit = False
        self.writes = 0

    @property
    def dirty(self) -> bool:
        return bool(self.evidence or self.events or self.signals)

    def scope(self) -> dict[str, Any]:
        return {
            "input": self.task.input,
            "steps": self.checkpoint.outputs,
            "context": {
                "task_id": self.task.id,
                "tenant": self.task.tenant,
                "workflow": self.definition.name,
                "version": self.definition.version,
                "step": self.checkpoint.cursor,
            },
        }

    def write(self, **fields: Any) -> FencedWrite:
        """A fenced write of the current checkpoint plus everything not yet written."""
        self.writes += 1
        write = FencedWrite(
            task_id=self.task.id,
            token=self.task.token,
            checkpoint=self.checkpoint.to_json(),
            evidence=tuple(self.evidence),
            events=tuple(self.events),
            signals=tuple(self.signals),
            write_id=f"{self.task.token}:{self.writes}",
            **fields,
        )
        self.evidence.clear()
        self.events.clear()
        self.signals.clear()
        return write


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
        """Fail the task over the checkpoint its cycle started from.

        Used when the database refused a write (a value it cannot store) or the engine
        failed: nothing of the cycle's progress is written, so the task never stays stuck on
        a write that cannot succeed.
        """
        step = task.checkpoint.get("cursor") if isinstance(task.checkpoint, dict) else None
        error = {"name": name, "message": storable_text(message), "step": step}
        base = task.checkpoint if isinstance(task.checkpoint, dict) else {}
        write = FencedWrite(
            task_id=task.id,
            token=task.token,
            checkpoint={**base, "cursor": None},
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
                cycle.events.append(Event("released", {"reason": "worker stopping"}))
                await self._commit(cycle, state="queued", delay_seconds=0)
        except (LeaseLost, DatabaseUnavailable):
            pass  # the lease lapses on its own; the next claim resumes from the checkpoint

    async def _commit(self, cycle: _Cycle, **fields: Any) -> None:
        write = cycle.write(**fields)
        applied = await self._retrying(cycle.control, functools.partial(self._apply, write))
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
        if cycle.task.recovered:
            outcome = await self._count_lost_attempt(cycle)
            if outcome is not None:
                return outcome
        while True:
            assert cp.cursor is not None, "a task with no cursor is terminal"
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
                return await self._fail(cycle, {"name": step.error, "message": text})
            if isinstance(step, WaitStep):
                outcome = await self._wait(cycle, step)
            else:
                outcome = await self._effect(cycle, step, control)
            if outcome is not None:
                return outcome

    async def _advance(
        self, cycle: _Cycle, step: EffectStep | WaitStep, output: Any
    ) -> CycleOutcome | None:
        """Record a step's output and move on; a step without ``next`` ends the workflow."""
        cp = cycle.checkpoint
        cp.outputs[step.id] = output
        if step.next is None:
            return await self._succeed(cycle, output)
        cp.enter(step.next)
        return None

    async def _step_failed(
        self, cycle: _Cycle, step: EffectStep | WaitStep, error: Error
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
        occurrence = cp.occurrence(step.id)
        if cp.pending == occurrence:
            return None  # the intent is recorded; _effect sends it to reconciliation
        cp.attempts[occurrence] = cp.attempts.get(occurrence, 0) + 1
        cycle.events.append(Event("attempt_lost", {"step": step.id, "occurrence": occurrence}))
        if cp.attempts[occurrence] >= step.retry.max_attempts:
            cp.attempts.pop(occurrence)
            lost = step.retry.max_attempts
            message = f"step {step.id!r}: {lost} attempts were lost to crashes or expired leases"
            return await self._step_failed(
                cycle, step, {"name": "AttemptsExhausted", "message": message, "attempts": lost}
            )
        await self._commit(cycle)
        return None

    async def _effect(
        self, cycle: _Cycle, step: EffectStep, control: CycleControl
    ) -> CycleOutcome | None:
        cp = cycle.checkpoint
        task = cycle.task
        occurrence = cp.occurrence(step.id)
        key = f"{task.id}:{occurrence}"
        if cp.pending == occurrence:
            resolution = cp.resolution
            if resolution is None or resolution.get("occurrence") != occurrence:
                # Intent recorded, outcome unknown, not idempotent: fail closed (DESIGN §2).
                return await self._reconcile(cycle, step, occurrence)
            cp.resolution = None
            cp.pending = None
            if resolution["outcome"] == "completed":
                cp.attempts.pop(occurrence, None)
                return await self._advance(cycle, step, resolution["result"])
            if resolution["outcome"] == "failed":
                attempt = cp.attempts.get(occurrence, 1)
                return await self._after_failure(
                    cycle, step, occurrence, attempt, resolution["error"]
                )
            # "retry": call again below, with a new intent record and the same key.
        handler = self._app.handler(step.handler)
        attempt = cp.attempts.get(occurrence, 0) + 1
        args = step.args.render(cycle.scope())

        def record(kind: Any, result: Any = None, error: Any = None) -> EvidenceRecord:
            return EvidenceRecord(
                occurrence=occurrence, step=step.id, handler=step.handler,
                idempotent=step.idempotent, idempotency_key=key, record=kind,
                attempt=attempt, result=result, error=error,
            )  # fmt: skip

        if faults.ARMED:
            faults.fault_point("before_intent", step.id)
        if not step.idempotent:
            # The intent carries the attempt; a takeover finds it pending and reconciles.
            cp.attempts[occurrence] = attempt
            cycle.evidence.append(record("started"))
            cp.pending = occurrence
        if cycle.dirty:
            await self._commit(cycle)
        # An idempotent attempt is not written before the call: a takeover counts it as lost.
        cp.attempts[occurrence] = attempt
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
            cp.pending = None
            cp.attempts.pop(occurrence, None)
            cycle.evidence.append(record("failed", error=error))
            return await self._step_failed(cycle, step, {**error, "attempts": attempt})
        except _TimedOut:
            error = {"name": "Timeout", "message": f"step {step.id!r} ran past {step.timeout:g} s"}
            if not step.idempotent:
                # The call may or may not have had its effect: uncertain, so reconcile.
                return await self._reconcile(cycle, step, occurrence, error)
            cycle.evidence.append(record("failed", error=error))
            return await self._after_failure(cycle, step, occurrence, attempt, error)
        except Exception as exc:  # a handler's error is data: it goes to the retry policy
            error = error_data(exc)
            cycle.evidence.append(record("failed", error=error))
            return await self._after_failure(cycle, step, occurrence, attempt, error)
        finally:
            if self._metrics is not None:
                self._metrics.step_duration.labels(cycle.definition.name, step.id, outcome).observe(
                    time.monotonic() - started
                )
        if faults.ARMED:
            faults.fault_point("after_call", step.id)
        cp.pending = None
        cp.attempts.pop(occurrence, None)
        cycle.evidence.append(record("completed", result=result))
        return await self._advance(cycle, step, result)

    async def _reconcile(
        self, cycle: _Cycle, step: EffectStep, occurrence: str, error: Error | None = None
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

    async def _after_failure(
        self, cycle: _Cycle, step: EffectStep, occurrence: str, attempt: int, error: Error
    ) -> CycleOutcome | None:
        cp = cycle.checkpoint
        cp.pending = None
        policy = step.retry
        if attempt < policy.max_attempts and error["name"] not in policy.non_retryable:
            delay = policy.delay(attempt)
            cycle.events.append(
                Event(
                    "retry_scheduled",
                    {"step": step.id, "attempt": attempt, "delay_seconds": delay, "error": error},
                )
            )
            await self._commit(cycle, state="queued", delay_seconds=delay)
            if self._metrics is not None:
                self._metrics.retries.labels(cycle.definition.name).inc()
            return CycleOutcome.RETRY
        cp.attempts.pop(occurrence, None)
        return await self._step_failed(cycle, step, {**error, "attempts": attempt})

    # --- waits --------------------------------------------------------------------------------

    async def _wait(self, cycle: _Cycle, step: WaitStep) -> CycleOutcome | None:
        cp = cycle.checkpoint
        occurrence = cp.occurrence(step.id)
        resumed = cp.wait is not None and cp.wait.get("occurrence") == occurrence
        if step.signal is not None:
            taken = [signal_id for signal_id, _ in cycle.signals]
            found = await self._retrying(
                cycle.control,
                functools.partial(self._leases.next_signal, cycle.task.id, step.signal, taken),
            )
            if found is not None:
                signal_id, payload = found
                cycle.signals.append((signal_id, occurrence))
                cp.wait = None
                return await self._advance(cycle, step, payload)
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
            # The write woke the task if the signal was stored before it; one sent while the
            # write waited for the row is caught here. The wait is committed either way: a
            # failure here is no reason to report the cycle as anything but waiting.
            try:
                await self._leases.wake_if_signalled(cycle.task.id, step.signal)
            except (DatabaseUnavailable, StoreError) as exc:
                logger.info(
                    "could not look for a signal after the wait was committed: %s",
                    exc,
                    extra={"action": "wake_check_failed", "task_id": cycle.task.id},
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

    # --- terminal writes ----------------------------------------------------------------------

    async def _succeed(self, cycle: _Cycle, result: Any) -> CycleOutcome:
        cycle.checkpoint.enter(None)
        cycle.events.append(Event("succeeded"))
        await self._commit(cycle, state="succeeded", result=result)
        return CycleOutcome.SUCCEEDED

    async def _fail(self, cycle: _Cycle, error: Error) -> CycleOutcome:
        error.setdefault("step", cycle.checkpoint.cursor)
        if isinstance(error.get("message"), str):
            error["message"] = storable_text(error["message"])
        cycle.checkpoint.cursor = None
        cycle.events.append(Event("failed", {"error": error}))
        await self._commit(cycle, state="failed", error=error)
        return CycleOutcome.FAILED

    async def _cancel(self, cycle: _Cycle, request: Any) -> CycleOutcome:
        reason = request.get("reason") if isinstance(request, dict) else None
        error = {"name": "Cancelled", "message": reason or "cancelled by request"}
        error["step"] = cycle.checkpoint.cursor
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
