"""The interpreter: resume a task from its checkpoint and run its steps (DESIGN §2, §4).

One call of :meth:`Interpreter.execute` is one claim-and-execute cycle for one task. Pure
steps (choice, succeed, fail) need no write of their own; the evidence of a finished effect
is committed together with whatever comes next (the following intent, the wait, or the
terminal state), always by one fenced statement.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import psycopg

from toolkit.checkpoint import Checkpoint
from toolkit.definition import (
    ChoiceStep,
    EffectStep,
    FailStep,
    SucceedStep,
    WorkflowDefinition,
)
from toolkit.errors import (
    DatabaseUnavailable,
    ExpressionError,
    HandlerNotFound,
    LeaseLost,
    ResultNotJson,
)
from toolkit.expressions import is_truthy
from toolkit.leases import ClaimedTask, Event, EvidenceRecord, FencedWrite, Leases
from toolkit.registry import App, EffectContext, Handler

logger = logging.getLogger(__name__)

ConnectionFactory = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]


class CycleOutcome(enum.StrEnum):
    """How one claim-and-execute cycle ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    WAITING = "waiting"
    RETRY = "retry"
    LEASE_LOST = "lease_lost"
    RELEASED = "released"
    DATABASE_UNAVAILABLE = "database_unavailable"


def error_data(exc: BaseException) -> dict[str, Any]:
    """The JSON form of an error raised by a handler or the engine.

    The name is the exception's ``error_name`` attribute when it has one, else its class
    name; it is what ``retry.non_retryable`` matches.
    """
    name = getattr(exc, "error_name", None) or type(exc).__name__
    return {"name": str(name), "message": str(exc) or type(exc).__name__}


class _Cycle:
    """State of one cycle: the task, its lease, the checkpoint and unflushed evidence."""

    def __init__(self, task: ClaimedTask, definition: WorkflowDefinition) -> None:
        self.task = task
        self.definition = definition
        self.checkpoint = Checkpoint.from_json(task.checkpoint)
        self.evidence: list[EvidenceRecord] = []
        self.events: list[Event] = []

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
        """A fenced write of the current checkpoint plus everything not yet flushed."""
        write = FencedWrite(
            task_id=self.task.id,
            token=self.task.token,
            checkpoint=self.checkpoint.to_json(),
            evidence=tuple(self.evidence),
            events=tuple(self.events),
            **fields,
        )
        self.evidence.clear()
        self.events.clear()
        return write


class Interpreter:
    """Runs claimed tasks with the handlers of one :class:`~toolkit.registry.App`.

    Args:
        leases: the store's fenced writes.
        app: the handler registry.
        worker_id: the id every write is fenced with.
        connection: factory for ``EffectContext.connection()``.
    """

    def __init__(
        self, leases: Leases, app: App, worker_id: str, connection: ConnectionFactory
    ) -> None:
        self._leases = leases
        self._app = app
        self._worker_id = worker_id
        self._connection = connection

    async def execute(self, task: ClaimedTask, definition: WorkflowDefinition) -> CycleOutcome:
        """Run ``task`` from its checkpoint until it ends, waits or is released.

        If the surrounding scope is cancelled (shutdown past its grace, or a heartbeat that
        found the lease lost), the task is released with a fenced write when the lease is
        still held, and the cancellation propagates.

        Returns:
            How the cycle ended. Never raises for lease loss or an unreachable database:
            those end the cycle (the lease lapses and another claim resumes the task).
        """
        cycle = _Cycle(task, definition)
        try:
            return await self._run(cycle)
        except LeaseLost:
            logger.warning(
                "lease lost; the task will be resumed by its next claim",
                extra={"action": "lease_lost", "task_id": task.id, "token": task.token},
            )
            return CycleOutcome.LEASE_LOST
        except DatabaseUnavailable as exc:
            logger.warning(
                "database unavailable during a cycle: %s",
                exc,
                extra={"action": "cycle_database_unavailable", "task_id": task.id},
            )
            return CycleOutcome.DATABASE_UNAVAILABLE
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._release(cycle)
            raise

    async def _release(self, cycle: _Cycle) -> None:
        cycle.events.append(Event("released", {"reason": "worker stopping"}))
        try:
            await self._leases.commit(self._worker_id, cycle.write(state="queued", delay_seconds=0))
        except (LeaseLost, DatabaseUnavailable):
            pass  # the lease lapses on its own; the next claim resumes from the checkpoint

    async def _run(self, cycle: _Cycle) -> CycleOutcome:
        try:
            return await self._steps(cycle)
        except (ExpressionError, ResultNotJson, HandlerNotFound) as exc:
            # A fault of the definition or the application, not of one attempt: the task fails.
            return await self._fail(cycle, error_data(exc))

    async def _steps(self, cycle: _Cycle) -> CycleOutcome:
        cp = cycle.checkpoint
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
                    return await self._fail(
                        cycle,
                        {
                            "name": "NoChoiceMatched",
                            "message": f"no choice of step {step.id!r} matched",
                        },
                    )
                cp.enter(target)
            elif isinstance(step, SucceedStep):
                return await self._succeed(cycle, step.output.render(cycle.scope()))
            elif isinstance(step, FailStep):
                message = step.message.render(cycle.scope())
                return await self._fail(
                    cycle, {"name": step.error, "message": "" if message is None else str(message)}
                )
            else:
                outcome = await self._effect(cycle, step)
                if outcome is not None:
                    return outcome

    async def _count_lost_attempt(self, cycle: _Cycle) -> CycleOutcome | None:
        """A takeover: the previous lease expired mid-cycle. That attempt counts (DESIGN §2)."""
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
            return await self._fail(
                cycle,
                {
                    "name": "AttemptsExhausted",
                    "message": (
                        f"step {step.id!r}: {cp.attempts[occurrence]} of "
                        f"{step.retry.max_attempts} attempts were lost to crashes or expired leases"
                    ),
                },
            )
        await self._leases.commit(self._worker_id, cycle.write())
        return None

    async def _effect(self, cycle: _Cycle, step: EffectStep) -> CycleOutcome | None:
        cp = cycle.checkpoint
        task = cycle.task
        occurrence = cp.occurrence(step.id)
        key = f"{task.id}:{occurrence}"
        if cp.pending == occurrence:
            # Intent recorded, outcome unknown, not idempotent: fail closed (DESIGN §2).
            cycle.events.append(
                Event("reconciliation_required", {"step": step.id, "occurrence": occurrence})
            )
            await self._leases.commit(
                self._worker_id, cycle.write(state="waiting", wait_reason="reconciliation")
            )
            return CycleOutcome.WAITING
        handler = self._app.handler(step.handler)
        attempt = cp.attempts.get(occurrence, 0) + 1
        cp.attempts[occurrence] = attempt
        args = step.args.render(cycle.scope())

        def record(kind: Any, result: Any = None, error: Any = None) -> EvidenceRecord:
            return EvidenceRecord(
                occurrence=occurrence, step=step.id, handler=step.handler,
                idempotent=step.idempotent, idempotency_key=key, record=kind,
                attempt=attempt, result=result, error=error,
            )  # fmt: skip

        if not step.idempotent:
            cycle.evidence.append(record("started"))
            cp.pending = occurrence
        if cycle.evidence or cycle.events:
            await self._leases.commit(self._worker_id, cycle.write())

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
        )
        try:
            result = await self._call(handler, step, ctx, args)
        except ResultNotJson as exc:
            # The call happened; its result cannot be recorded. Not an attempt to repeat.
            error = error_data(exc)
            cp.pending = None
            cycle.evidence.append(record("failed", error=error))
            return await self._fail(cycle, {**error, "step": step.id})
        except _TimedOut:
            error = {"name": "Timeout", "message": f"step {step.id!r} ran past {step.timeout:g} s"}
            if not step.idempotent:
                # The call may or may not have had its effect: uncertain, so reconcile.
                cycle.events.append(
                    Event(
                        "reconciliation_required",
                        {"step": step.id, "occurrence": occurrence, "error": error},
                    )
                )
                await self._leases.commit(
                    self._worker_id, cycle.write(state="waiting", wait_reason="reconciliation")
                )
                return CycleOutcome.WAITING
            return await self._after_failure(
                cycle, step, occurrence, attempt, record("failed", error=error), error
            )
        except Exception as exc:  # a handler's error is data: it goes to retry policy
            error = error_data(exc)
            return await self._after_failure(
                cycle, step, occurrence, attempt, record("failed", error=error), error
            )

        cp.pending = None
        cp.attempts.pop(occurrence, None)
        cp.outputs[step.id] = result
        cycle.evidence.append(record("completed", result=result))
        if step.next is None:
            cp.enter(None)
            return await self._succeed(cycle, result)
        cp.enter(step.next)
        return None

    async def _call(self, handler: Handler, step: EffectStep, ctx: EffectContext, args: Any) -> Any:
        deadline = math.inf if step.timeout is None else anyio.current_time() + step.timeout
        with anyio.CancelScope(deadline=deadline) as scope:
            if handler.is_async:
                result = await handler.call(ctx, args)
            else:
                result = await anyio.to_thread.run_sync(
                    functools.partial(handler.call, ctx, args), abandon_on_cancel=True
                )
        if scope.cancelled_caught:
            raise _TimedOut
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ResultNotJson(
                f"handler {step.handler!r} of step {step.id!r} returned a value that is not "
                f"JSON: {exc}"
            ) from exc
        return result

    async def _after_failure(
        self,
        cycle: _Cycle,
        step: EffectStep,
        occurrence: str,
        attempt: int,
        failed: EvidenceRecord,
        error: dict[str, Any],
    ) -> CycleOutcome:
        cp = cycle.checkpoint
        cp.pending = None
        cycle.evidence.append(failed)
        policy = step.retry
        if attempt < policy.max_attempts and error["name"] not in policy.non_retryable:
            delay = policy.delay(attempt)
            cycle.events.append(
                Event(
                    "retry_scheduled",
                    {"step": step.id, "attempt": attempt, "delay_seconds": delay, "error": error},
                )
            )
            await self._leases.commit(
                self._worker_id, cycle.write(state="queued", delay_seconds=delay)
            )
            return CycleOutcome.RETRY
        cp.attempts.pop(occurrence, None)
        return await self._fail(cycle, {**error, "step": step.id, "attempts": attempt})

    async def _succeed(self, cycle: _Cycle, result: Any) -> CycleOutcome:
        cycle.checkpoint.cursor = None
        cycle.events.append(Event("succeeded"))
        await self._leases.commit(self._worker_id, cycle.write(state="succeeded", result=result))
        return CycleOutcome.SUCCEEDED

    async def _fail(self, cycle: _Cycle, error: dict[str, Any]) -> CycleOutcome:
        error.setdefault("step", cycle.checkpoint.cursor)
        cycle.checkpoint.cursor = None
        cycle.events.append(Event("failed", {"error": error}))
        await self._leases.commit(self._worker_id, cycle.write(state="failed", error=error))
        return CycleOutcome.FAILED


class _TimedOut(Exception):
    """The step's timeout passed before the handler returned."""
