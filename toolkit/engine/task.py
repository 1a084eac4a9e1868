"""The task's own graph: its steps run until the task ends, waits or is released.

:class:`TaskGraph` is the level at which a wait is made durable: the task commits what it
waits for and releases its lease, and the next claim resumes it from the checkpoint. It also
holds the task's terminal writes and what happens before the first step of a cycle (the
workflow deadline, a compensation in progress, a takeover's lost attempt).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from toolkit.checkpoint import Checkpoint, Compensation, Lapses
from toolkit.definition import EffectStep, Step, catch_target
from toolkit.engine.compensation import compensate as run_compensations
from toolkit.engine.cycle import Cycle, CycleOutcome
from toolkit.engine.deadline import deadline_passed
from toolkit.engine.failures import Error, error_data, storable_text
from toolkit.engine.map_children import cancel_map_children
from toolkit.engine.protocol import (
    Advance,
    Failed,
    Finish,
    Goto,
    Kinds,
    Reconcile,
    Retry,
    Spend,
    StepContext,
    Transition,
    Wait,
    run_graph,
)
from toolkit.engine.reservations import release
from toolkit.engine.subscriptions import subscribe
from toolkit.errors import ExpressionError, HandlerNotFound, ResultNotJson, ResultTooLarge
from toolkit.lifecycle import EventKind, TaskState, WaitReason
from toolkit.store.writes import NEVER, Event

#: Leases lapsed in a row at a pure step, without a step finished, that fail the task.
MAX_LAPSES = 5


class TaskGraph:
    """The task's own graph, run in one cycle.

    Args:
        cycle: the cycle.
        kinds: the step kinds.
    """

    def __init__(self, cycle: Cycle, kinds: Kinds) -> None:
        self.cycle = cycle
        self.kinds = kinds

    @property
    def frame(self) -> Checkpoint:
        """The task's progress: its checkpoint."""
        return self.cycle.checkpoint

    def running(self) -> bool:
        """Always: a task with a checkpoint to resume has a next step."""
        assert self.cycle.checkpoint.cursor is not None, "a task with no cursor is terminal"
        return True

    def steps(self) -> Mapping[str, Step]:
        """The definition's steps by id."""
        return self.cycle.definition.steps

    def context(self, step: Step) -> StepContext:
        """What a step of the task runs with."""
        cycle = self.cycle
        spend = Spend(cycle.spend_limits, cycle.charge)
        return StepContext(cycle, cycle.checkpoint, cycle.scope(), spend, self.kinds)

    async def before(self, step: Step) -> CycleOutcome | None:
        """Fail the task once it has run its definition's ``max_steps``."""
        cp, definition = self.cycle.checkpoint, self.cycle.definition
        if cp.steps_run < definition.max_steps:
            return None
        message = (
            f"the task ran {cp.steps_run} steps, its definition's max_steps: a loop that does "
            "not end?"
        )
        return await self.fail({"name": "MaxStepsExceeded", "message": message})

    async def run(self) -> CycleOutcome:
        """Run the task from its checkpoint until it ends, waits or is released.

        A fault of the definition or the application (an expression that cannot be
        evaluated, a result that cannot be stored, a missing handler), not of one attempt,
        fails the task.
        """
        try:
            return await self._run()
        except (ExpressionError, ResultNotJson, ResultTooLarge, HandlerNotFound) as exc:
            return await self.fail(error_data(exc))

    async def _run(self) -> CycleOutcome:
        cycle = self.cycle
        cp, task = cycle.checkpoint, cycle.task
        if cp.started_at is None:  # recorded once: context.started_at is the same on resume
            cp.started_at = datetime.datetime.now(datetime.UTC).isoformat()
            cancelled_by = await subscribe(cycle)
            if cancelled_by is not None:  # its cancel_on event came before it started
                return await self.cancel({"reason": cancelled_by})
        if task.deadline_in is not None and task.deadline_in <= 0:
            error = await deadline_passed(cycle)
            if error is not None:
                return await self.fail(error)
        if cp.compensating is not None:
            return await run_compensations(cycle, self.kinds, self.apply)
        if task.recovered:
            outcome = await self._taken_over()
            if outcome is not None:
                return outcome
        outcome = await run_graph(self)
        assert outcome is not None, "the task's graph runs until the cycle ends"
        return outcome

    async def _taken_over(self) -> CycleOutcome | None:
        """A takeover: the previous lease expired mid-cycle. Its attempt counts.

        At an effect, the lost attempt counts against its retries. At a pure step, or at an
        effect when the lapsed lease's holder had a checkpoint window, the lapse counts:
        :data:`MAX_LAPSES` in a row without a step finished fail the task ``LeasesLapsed``
        (a step that stalls or crashes every worker that runs it). A lapse
        is not counted across a restart of the database server, or when this worker found
        the database unreachable within the lease before the claim (an outage's lapse).
        """
        cp = self.cycle.checkpoint
        assert cp.cursor is not None
        step = self.cycle.definition.steps[cp.cursor]
        kind = self.kinds[type(step)]
        if kind.pure or (self.cycle.task.deferred_before and isinstance(step, EffectStep)):
            # A holder with a checkpoint window may have run past an effect under the cursor
            # (only idempotent calls and pure steps are passed without a write): which step
            # crashed is not known, so the lapse counts against the task (migration 0027).
            return await self._lapsed(step)
        taken_over = kind.taken_over
        if taken_over is None:
            return None
        transition = taken_over(self.context(step), step)
        if transition is None:
            await self.cycle.commit()
            return None
        return await self.apply(step, transition)

    async def _lapsed(self, step: Step) -> CycleOutcome | None:
        """Count a lease that lapsed at ``step``; fail the task at the bound.

        ``step`` is pure, or the lapsed lease's holder had a checkpoint window.
        """
        cycle = self.cycle
        if cycle.control.outage_seen:
            return None
        cp = cycle.checkpoint
        leases = cycle.services.store.leases
        started = await cycle.retrying(leases.server_started)
        previous = cp.lapses
        count = 1
        if previous is not None and (previous.steps_run, previous.server_started) == (
            cp.steps_run, started
        ):
            count = previous.count + 1
        if count >= MAX_LAPSES:
            message = (
                f"the task's lease lapsed {count} times in a row at step {step.id!r} without "
                "a step finishing: a step that stalls or crashes the worker running it?"
            )
            return await self.fail({"name": "LeasesLapsed", "message": message})
        cp.lapses = Lapses(count, cp.steps_run, started)
        await cycle.commit()  # durable before the step runs again: it may crash this worker
        return None

    async def apply(self, step: Step, transition: Transition) -> CycleOutcome | None:
        """Carry out what ``step`` came to at the task's level.

        Returns:
            None when the task goes on to its next step in this cycle, else how the cycle
            ended (a terminal write, or a wait, retry or reconciliation committed).
        """
        cycle = self.cycle
        cp = cycle.checkpoint
        if isinstance(transition, Goto):
            cp.enter(transition.target)
        elif isinstance(transition, Advance):
            cp.outputs[step.id] = transition.output
            if transition.next is None:
                return await self.succeed(transition.output)
            cp.enter(transition.next)
        elif isinstance(transition, Finish):
            return await self.succeed(transition.output)
        elif isinstance(transition, Failed):
            return await self._failed(step, transition)
        elif isinstance(transition, Wait):
            cp.wait = transition.wait
            cycle.events.append(transition.event)
            if transition.run_at is not None:
                await cycle.commit(
                    state=TaskState.WAITING, wait_reason=transition.reason,
                    run_at=transition.run_at,
                )  # fmt: skip
            else:
                await cycle.commit(
                    state=TaskState.WAITING, wait_reason=transition.reason,
                    delay_seconds=transition.delay_seconds,
                )  # fmt: skip
            return CycleOutcome.WAITING
        elif isinstance(transition, Retry):
            cycle.retry_scheduled(
                step.id, transition.occurrence, transition.attempt, transition.error,
                transition.delay,
            )  # fmt: skip
            await cycle.commit(state=TaskState.QUEUED, delay_seconds=transition.delay)
            return CycleOutcome.RETRY
        else:
            assert isinstance(transition, Reconcile)
            cp.pending = transition.occurrence
            cycle.reconciliation_required(step.id, transition.occurrence, transition.error)
            await cycle.commit(
                state=TaskState.WAITING, wait_reason=WaitReason.RECONCILIATION, run_at=NEVER
            )
            return CycleOutcome.WAITING
        return None

    async def _failed(self, step: Step, failed: Failed) -> CycleOutcome | None:
        """A step failed for good: route to its ``catch`` target, else fail the task."""
        error = failed.error
        target = catch_target(getattr(step, "catch", ()), error["name"])
        if target is None:
            return await self.fail({**error, "step": step.id}, compensate=failed.compensate)
        cp = self.cycle.checkpoint
        cp.outputs[step.id] = {"error": error}
        self.cycle.events.append(
            Event(EventKind.CAUGHT, {"step": step.id, "error": error, "next": target})
        )
        cp.enter(target)
        return None

    # --- terminal writes ------------------------------------------------------------------

    async def succeed(self, result: Any) -> CycleOutcome:
        """End the task ``succeeded`` with ``result``."""
        cycle = self.cycle
        cycle.checkpoint.enter(None)
        cycle.events.append(Event(EventKind.SUCCEEDED))
        await cycle.commit(state=TaskState.SUCCEEDED, result=result)
        return CycleOutcome.SUCCEEDED

    async def fail(self, error: Error, compensate: bool = True) -> CycleOutcome:
        """Fail the task, after compensating its completed effects when it has any.

        ``compensate`` is False for a ``fail`` step without ``compensate: true``; a task
        that is compensating already is not compensated again.
        """
        cycle = self.cycle
        cp = cycle.checkpoint
        error.setdefault("step", cp.cursor)
        await cancel_map_children(cycle, f"parent task {cycle.task.id} failed")
        if isinstance(error.get("message"), str):
            error["message"] = storable_text(error["message"])
        if compensate and cp.compensable and cp.compensating is None:
            cp.compensating = Compensation(error)
            steps = [entry.occurrence for entry in reversed(cp.compensable)]
            cycle.events.append(
                Event(EventKind.COMPENSATING, {"error": error, "compensate": steps})
            )
            return await run_compensations(cycle, self.kinds, self.apply)
        cp.cursor = None
        cycle.events.append(Event(EventKind.FAILED, {"error": error}))
        await cycle.commit(state=TaskState.FAILED, error=error)
        return CycleOutcome.FAILED

    async def cancel(self, request: Any) -> CycleOutcome:
        """End the task ``cancelled`` (a cancel request found at a claim or a heartbeat)."""
        cycle = self.cycle
        cp = cycle.checkpoint
        reason = request.get("reason") if isinstance(request, dict) else None
        error = {"name": "Cancelled", "message": reason or "cancelled by request"}
        error["step"] = cp.cursor
        if cp.fanout is not None:  # its reservation returns, its budget says so
            release(cycle, cp.fanout)
        await cancel_map_children(cycle, f"parent task {cycle.task.id} cancelled")
        cycle.events.append(Event(EventKind.CANCELLED, {"reason": error["message"]}))
        await cycle.commit(state=TaskState.CANCELLED, error=error)
        return CycleOutcome.CANCELLED
