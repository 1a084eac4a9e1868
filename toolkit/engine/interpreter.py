"""The interpreter: resume a task from its checkpoint and run its steps (DESIGN §2, §4).

One call of :meth:`Interpreter.execute` is one claim-and-execute cycle for one task. Pure
steps (choice, succeed, fail, set) need no write of their own; the evidence of a finished
effect is committed together with whatever comes next (the next intent, the wait, or the
terminal state), always by one fenced statement.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable

import anyio

from toolkit import tracing
from toolkit.application import App
from toolkit.definition import WorkflowDefinition
from toolkit.engine.cycle import (
    Cycle,
    CycleControl,
    CycleOutcome,
    Services,
    WorkerStopping,
    retrying,
)
from toolkit.engine.failures import storable_text
from toolkit.engine.kinds import KINDS
from toolkit.engine.task import TaskGraph
from toolkit.errors import DatabaseUnavailable, LeaseLost, StoreError
from toolkit.lifecycle import EventKind, TaskState
from toolkit.metrics import WorkerMetrics
from toolkit.store import Store
from toolkit.store.leases import ClaimedTask
from toolkit.store.writes import Event, FencedWrite

logger = logging.getLogger(__name__)


class Interpreter:
    """Runs claimed tasks with the handlers of one :class:`~toolkit.application.App`.

    Args:
        store: the store (fenced writes, budgets, limits, callbacks, children).
        app: the handler registry.
        worker_id: the id every write is fenced with.
        metrics: where step durations, waits and retries are recorded; None for nowhere.
        commit: how fenced writes are applied; default one statement each
            (``store.leases.commit``); the supervisor passes its group commit.
    """

    def __init__(
        self,
        store: Store,
        app: App,
        worker_id: str,
        metrics: WorkerMetrics | None = None,
        commit: Callable[[FencedWrite], Awaitable[TaskState]] | None = None,
    ) -> None:
        self._services = Services(store, app, worker_id, metrics, commit or store.leases.commit)

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
        with tracing.span(
            f"run {definition.name}",
            functools.partial(self._attributes, task, definition),
            parent=task.trace_parent,
            links=_earlier_attempt(task),
            consumer=True,
        ) as span:
            outcome = await self._execute(task, definition, control, span)
            span.outcome(outcome.value)
            return outcome

    def _attributes(self, task: ClaimedTask, definition: WorkflowDefinition) -> tracing.Attributes:
        """The attributes of a cycle's span (docs/tracing.md)."""
        return {
            "task.id": task.id,
            "task.tenant": task.tenant,
            "workflow.name": definition.name,
            "workflow.version": definition.version,
            "fencing_token": task.token,
            "worker.id": self._services.worker_id,
            "task.claims": task.attempts,
            "task.recovered": task.recovered,
        }

    async def _execute(
        self,
        task: ClaimedTask,
        definition: WorkflowDefinition,
        control: CycleControl,
        span: tracing.Span,
    ) -> CycleOutcome:
        try:
            cycle = Cycle(task, definition, control, self._services)
            graph = TaskGraph(cycle, KINDS)
            if span.recording:  # its first write records it: the next attempt links to it
                cycle.trace_attempt = span.traceparent()
            if task.cancel_requested:
                return await graph.cancel(task.cancel_requested)
            outcome = await graph.run()
            return CycleOutcome.CANCELLED if cycle.cancelled_at_commit else outcome
        except WorkerStopping:
            await self._end_interrupted(graph, control)
            return CycleOutcome.RELEASED
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
            if control.call_stop is not None:
                control.call_stop.set()
            if not control.lease_lost:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await self._end_interrupted(graph, control)
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
            fence=task.fence(self._services.worker_id),
            checkpoint=None,
            state=TaskState.FAILED,
            error=error,
            events=(Event(EventKind.FAILED, {"error": error}),),
            write_id=f"{task.token}:failed",
            ends_child=task.child,
        )
        try:
            await retrying(control, functools.partial(self._services.apply, write))
        except (LeaseLost, DatabaseUnavailable, StoreError):
            return CycleOutcome.LEASE_LOST
        return CycleOutcome.FAILED

    @staticmethod
    async def _end_interrupted(graph: TaskGraph, control: CycleControl) -> None:
        cycle = graph.cycle
        try:
            if control.cancel_requested is not None:
                await graph.cancel(control.cancel_requested)
            else:
                # At the workflow deadline the next claim (at once) applies it.
                past = anyio.current_time() >= control.deadline
                reason = "workflow deadline" if past else "worker stopping"
                cycle.events.append(Event(EventKind.RELEASED, {"reason": reason}))
                await cycle.commit(state=TaskState.QUEUED, delay_seconds=0)
        except (LeaseLost, DatabaseUnavailable):
            pass  # the lease lapses on its own; the next claim resumes from the checkpoint


def _earlier_attempt(task: ClaimedTask) -> list[tuple[str, tracing.Attributes]]:
    """The link from a cycle's span to the previous attempt's: lost (a takeover) or ended."""
    if task.trace_attempt is None:
        return []
    return [(task.trace_attempt, {"link.reason": "takeover" if task.recovered else "resumed"})]
