"""The supervisor: bounded claim-and-execute cycles, heartbeats, idle backoff, shutdown.

DESIGN §2 ("Supervisor") and §4 (the hot path). One :class:`WorkflowSupervisor` runs one
:class:`~toolkit.runtime.worker.Worker` with at most ``concurrency`` cycles at once. Idle
workers are woken by LISTEN/NOTIFY; polling with exponential backoff and jitter is the fallback. On
shutdown it claims nothing new, lets started cycles finish within a grace period, then
cancels the rest, which release their leases with a fenced write.

Database outages (a restart, terminated connections, an exhausted pool) never end the run:
every part of the supervisor tries again with backoff, and the run logs one warning when the
database becomes unreachable and one line when it is back, however many tasks and services
noticed. A lease is presumed lost once its holder could not renew it for a whole lease
duration (measured from the sending of the last renewal that succeeded, so never later than
the database's own expiry): its cycle is cancelled and writes nothing more; the fence refuses
any write that would still arrive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time

import anyio

from toolkit.engine import CycleControl, CycleOutcome, Interpreter
from toolkit.errors import DatabaseUnavailable, ToolkitError
from toolkit.lifecycle import TaskState
from toolkit.metrics import WorkerMetrics
from toolkit.runtime.config import CancellationToken, SupervisorConfig
from toolkit.runtime.firing import TickFirer
from toolkit.runtime.listener import Listener
from toolkit.runtime.outage import Outage
from toolkit.runtime.report import SupervisorReport
from toolkit.runtime.statement_gate import StatementGate
from toolkit.runtime.watches import watch_fleet, watch_loop_lag
from toolkit.runtime.worker import Worker
from toolkit.store.fence import Fence
from toolkit.store.group_commit import GroupCommit
from toolkit.store.leases import ClaimedTask, Renewal
from toolkit.store.writes import FencedWrite

__all__ = ["CancellationToken", "SupervisorConfig", "SupervisorReport", "WorkflowSupervisor"]

logger = logging.getLogger(__name__)

#: Seconds a worker waits at most to record itself stopped when the database is away.
UNREGISTER_TIMEOUT = 3.0
#: Seconds a stopping worker lets its service statements in flight end before cancelling.
STATEMENT_GRACE = 1.0


class WorkflowSupervisor:
    """Runs one worker: claims, executes, heartbeats, and shuts down gracefully.

    Args:
        worker: the worker (store, app, definitions, id).
        config: concurrency, lease and backoff settings.
        metrics: where to record Prometheus metrics; default a new :class:`WorkerMetrics`
            (serve it with ``metrics.serve(port)``).
    """

    def __init__(
        self,
        worker: Worker,
        config: SupervisorConfig | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.worker = worker
        self.config = config or SupervisorConfig()
        self.metrics = metrics or WorkerMetrics(worker.store.db.pool_stats)
        self.report = SupervisorReport(worker_id=worker.worker_id)
        self.registered = anyio.Event()  #: set once the worker id and definitions are registered
        #: The cycles running, by the task whose lease each holds.
        self._held: dict[int, RunningCycle] = {}
        #: Cycles given up: their handler call ignored its cancellation (see `_give_up`).
        self._abandoned: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self.metrics.in_flight.set_function(lambda: self._in_flight)  # read when scraped
        #: Cycles whose last write is on its way: their slots are free to claim (`_commit`).
        self._ending = 0
        self._wake = anyio.Event()
        self._drained = anyio.Event()
        self._group_commit = GroupCommit(worker.store.leases)
        self._outage = Outage(self.report, self.metrics)
        self._claim_scope: anyio.CancelScope | None = None
        self._refusals: dict[str, str] = {}
        self._shutdown = CancellationToken()
        self._interpreter = Interpreter(
            worker.store, worker.app, worker.worker_id, self.metrics, self._commit
        )
        names = [definition.name for definition in worker.definitions]
        self._gate = StatementGate()
        self._firer = TickFirer(worker.store.schedules, names, self.metrics, self._gate)

    async def _commit(self, write: FencedWrite) -> TaskState:
        """The group commit, watched for outages."""
        ending = write.state != TaskState.LEASED
        if ending:
            self._ending += 1
            self._wake.set()
        try:
            state = await self._group_commit.commit(write)
        except DatabaseUnavailable as exc:
            self._outage.failed(exc)
            raise
        finally:
            if ending:
                self._ending -= 1
        self._outage.succeeded()
        return state

    async def run(self, shutdown: CancellationToken | None = None) -> SupervisorReport:
        """Run until ``shutdown`` is cancelled (or, with ``until_idle``, the queue drains).

        Lifecycle: register the worker id and its definitions, then claim and execute; on
        shutdown stop claiming, give started cycles ``grace`` seconds to finish the lease
        protocol, cancel the rest (each releases its lease) and record the worker stopped.

        Once started, the run outlives database outages: it does not return or raise until
        shutdown (see the module docstring).

        Returns:
            The report of this run.

        Raises:
            WorkerIdInUse: another live process holds this worker id.
            DefinitionConflict: a loaded definition conflicts with a registered one.
            DatabaseUnavailable: the database is unreachable at start.
        """
        shutdown = shutdown or CancellationToken()
        self._shutdown = shutdown
        started = time.monotonic()
        config = self.config
        await self.worker.register(config.concurrency, config.lease, config.heartbeat)
        self.registered.set()
        shutdown.on_cancel(self._on_shutdown)
        logger.info(
            "worker started",
            extra={"action": "worker_start", "worker_id": self.worker.worker_id},
        )
        try:
            async with anyio.create_task_group() as services:
                services.start_soon(self._group_commit.run)
                services.start_soon(self._heartbeats)
                services.start_soon(self._listen)
                services.start_soon(watch_loop_lag, self.report, self.metrics)
                services.start_soon(
                    watch_fleet, self.worker.store, self.metrics, self._gate
                )
                services.start_soon(self._firer.run)
                try:
                    await self._claim_loop(shutdown)
                    if self._in_flight:
                        with anyio.move_on_after(self.config.grace):
                            await self._drained.wait()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop_cycles()
                self._group_commit.stop_soon(1.0)
                # The services end between statements (see toolkit.runtime.statement_gate).
                await self._gate.close(0.0 if self._outage.down else STATEMENT_GRACE)
                services.cancel_scope.cancel()
        finally:
            # Bounded: with the database away the worker row simply expires.
            bound = 1.0 if self._outage.down else UNREGISTER_TIMEOUT
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + bound):
                await self.worker.unregister()
            self.report.wall_time = time.monotonic() - started
            logger.info(
                "worker stopped",
                extra={"action": "worker_stop", "worker_id": self.worker.worker_id},
            )
        return self.report

    def _refused(self, action: str, message: str, exc: ToolkitError) -> None:
        """Log a refused statement as a warning, but the same refusal again only at DEBUG."""
        text = str(exc)
        level = logging.DEBUG if self._refusals.get(action) == text else logging.WARNING
        self._refusals[action] = text
        logger.log(level, message, text, extra={"action": action})

    def _on_shutdown(self) -> None:
        self._wake.set()
        for entry in self._held.values():  # no new call that a cut-off would leave uncertain
            entry.control.stopping = True
        # A claim waiting for a connection during an outage would hold shutdown up until the
        # pool gives up. When the database is known away, stop waiting: were the claim to
        # have gone through, its leases lapse and other workers recover the tasks.
        if self._outage.down and self._claim_scope is not None:
            self._claim_scope.cancel()

    async def _claim_loop(self, shutdown: CancellationToken) -> None:
        config = self.config
        backoff = config.idle_backoff_min
        # Claim in batches: while cycles run, wait until a good share of the slots is free
        # rather than claiming one task each time one cycle ends.
        refill = max(1, min(config.claim_size, config.concurrency) // 2)
        while not shutdown.cancelled:
            free = config.concurrency - self._in_flight + self._ending
            if free <= 0 or (free < refill and self._in_flight > 0):
                await self._idle(None)
                continue
            next_due: float | None = None
            tasks: list[ClaimedTask] = []
            sent = anyio.current_time()
            try:
                with anyio.CancelScope() as self._claim_scope:
                    with self.metrics.claim_latency.time():
                        tasks = await self.worker.claim(
                            min(free, config.claim_size), config.lease,
                            deferring=config.checkpoint_window > 0,
                        )  # fmt: skip
                    if not tasks:
                        pending, next_due = await self.worker.idle_state()
                        if config.until_idle and self._in_flight == 0 and not pending:
                            return
            except DatabaseUnavailable as exc:
                self._outage.failed(exc)
                await self._idle(backoff)
                backoff = min(backoff * 2, config.idle_backoff_max)
                continue
            except ToolkitError as exc:  # the database refused the claim: log, back off
                self._refused("claim_failed", "claim failed: %s", exc)
                await self._idle(config.idle_backoff_max)
                continue
            finally:
                self._claim_scope = None
            if shutdown.cancelled and not tasks:
                break
            self._outage.succeeded()
            for task in tasks:
                self._start_cycle(task, sent + config.lease)
            if tasks:
                backoff = config.idle_backoff_min
                continue
            wait = backoff * (1 - config.idle_jitter * random.random())
            if next_due is not None:
                wait = min(wait, next_due + 0.001)  # wake for the next timer or retry
            await self._idle(wait)
            backoff = min(backoff * 2, config.idle_backoff_max)

    async def _idle(self, seconds: float | None) -> None:
        """Wait for a wake-up (NOTIFY, a free slot, shutdown) or ``seconds``."""
        with anyio.move_on_after(seconds if seconds is not None else float("inf")):
            await self._wake.wait()
        if self._wake.is_set():
            self._wake = anyio.Event()

    def _start_cycle(self, task: ClaimedTask, lease_deadline: float) -> None:
        """Start a cycle for a claimed task: an asyncio task of its own (see `RunningCycle`)."""
        self.report.claimed += 1
        self.report.recovered += int(task.recovered)
        self.report.queue_delay_total += task.queue_delay
        name = self.worker.definition(task.digest).name
        metrics = self.metrics
        metrics.child(metrics.queue_delay, name).observe(max(task.queue_delay, 0.0))
        metrics.child(metrics.claimed, name, "true" if task.recovered else "false").inc()
        self._in_flight += 1
        self._drained = anyio.Event() if self._drained.is_set() else self._drained
        control = CycleControl(
            lease_deadline=lease_deadline, call_grace=self.config.call_grace,
            progress_every=self.config.heartbeat,
            # a takeover writes every outcome: a second crash then names its step
            checkpoint_window=0.0 if task.recovered else self.config.checkpoint_window,
            outage_seen=self._outage.seen_within(self.config.lease),
            stopping=self._shutdown.cancelled)  # fmt: skip
        if task.deadline_in is not None and task.deadline_in > 0:
            # The workflow deadline (database time, as seconds left at the claim) stops a
            # running cycle like a cancellation; the next claim applies it.
            control.deadline = anyio.current_time() + task.deadline_in
        scope = anyio.CancelScope(deadline=control.deadline)
        stale = self._held.get(task.id)
        if stale is not None:  # this worker took over its own task: the old cycle lost it
            stale.control.lease_lost = True
            stale.cancel()
        runner = asyncio.get_running_loop().create_task(
            self._cycle(task, scope, control), name=f"toolkit cycle, task {task.id}"
        )
        runner.add_done_callback(_report_fault)
        self._held[task.id] = RunningCycle(task.fence(self.worker.worker_id), scope, control,
                                           runner)  # fmt: skip

    async def _cycle(
        self, task: ClaimedTask, scope: anyio.CancelScope, control: CycleControl
    ) -> None:
        outcome = CycleOutcome.RELEASED
        definition = self.worker.definition(task.digest)
        started = time.monotonic()  # a duration for the metrics (anyio's clock costs more)
        try:
            with scope:
                outcome = await self._interpreter.execute(task, definition, control)
            if scope.cancelled_caught:
                outcome = (
                    CycleOutcome.LEASE_LOST if control.lease_lost
                    else CycleOutcome.CANCELLED if control.cancel_requested is not None
                    else CycleOutcome.RELEASED
                )  # fmt: skip
        finally:
            self._cycle_ended(task, definition.name, control, outcome, started)

    def _cycle_ended(
        self, task: ClaimedTask, definition: str, control: CycleControl,
        outcome: CycleOutcome, started: float,
    ) -> None:  # fmt: skip
        """Count a cycle that ended, and free its slot (unless it was given up before)."""
        if control.abandoned:  # its slot and counts were freed when it was given up
            logger.info(
                "an abandoned cycle of task %d ended after all (it writes nothing)", task.id,
                extra={"action": "abandoned_cycle_ended", "task_id": task.id},
            )  # fmt: skip
            return
        held = self._held.get(task.id)
        if held is not None and held.fence.token == task.token:
            del self._held[task.id]  # not a newer cycle's entry for the same task
        self.report.count(outcome)
        self._observe(definition, outcome, time.monotonic() - started)
        self._free_slot()

    def _free_slot(self) -> None:
        """A cycle ended or was given up: one more may start (and shutdown may end)."""
        self._in_flight -= 1
        if self._in_flight == 0:
            self._drained.set()
        self._wake.set()

    async def _stop_cycles(self) -> None:
        """Cancel the cycles still running; give up those that do not end within a grace.

        A cancelled cycle ends its lease protocol (releases its task, or commits a requested
        cancel). One whose handler call ignores the cancellation is given up after
        ``call_grace`` seconds, so the run can end (see `_give_up`).
        """
        if not self._in_flight:
            return
        for entry in list(self._held.values()):
            entry.cancel()
        with anyio.move_on_after(self.config.call_grace):
            await self._drained.wait()
        for task_id in list(self._held):
            self._give_up(task_id, "it did not stop within the grace after its cancellation")

    def _give_up_overdue(self) -> None:
        """Give up the cycles whose handler call ignores its cancellation (checked each beat).

        A call past its step's timeout plus ``call_grace``, or a cycle cancelled that long
        ago (a cancel request, a lost lease) and still running, is given up: its lease is no
        longer renewed, so it lapses and the task is claimed again.
        """
        now = anyio.current_time()
        for task_id, entry in list(self._held.items()):
            why = entry.overdue(now, self.config.call_grace)
            if why is not None:
                self._give_up(task_id, why)

    def _give_up(self, task_id: int, why: str) -> None:
        """Stop renewing a cycle's lease and stop waiting for it.

        Its handler call ignores its cancellation (a handler that swallows
        ``CancelledError``). The lease lapses and the task is claimed again as after a crash
        (a non-idempotent effect goes to reconciliation); if the call ever returns, its
        cycle writes nothing. The cycle's slot is freed. A process with a cycle given up
        exits without waiting for it (``SupervisorReport.abandoned``; ``toolkit run`` ends
        the process).
        """
        entry = self._held.pop(task_id)
        entry.control.lease_lost = True
        entry.control.abandoned = True
        self._abandoned.add(entry.runner)
        self.report.abandoned += 1
        self._free_slot()
        logger.error(
            "gave up the cycle of task %d: %s (its handler ignores cancellation); its lease "
            "is no longer renewed, and the task will be claimed again as after a crash",
            task_id,
            why,
            extra={"action": "cycle_abandoned", "task_id": task_id, "token": entry.fence.token},
        )

    def _observe(self, definition: str, outcome: CycleOutcome, seconds: float) -> None:
        metrics = self.metrics
        metrics.child(metrics.cycles, definition, outcome.value).inc()
        metrics.child(metrics.cycle_duration, definition, outcome.value).observe(seconds)
        if outcome is CycleOutcome.FAILED:
            metrics.child(metrics.failures, definition).inc()
        elif outcome is CycleOutcome.LEASE_LOST:
            metrics.lease_losses.inc()
            self._outage.leases_lost += 1

    async def _heartbeats(self) -> None:
        """Renew every held lease each interval; cancel the cycles whose lease is gone.

        A renewal that fails (database away, pool exhausted, a refused statement) is tried
        again at the next interval; a lease not renewed for a whole lease duration is
        presumed lost and its cycle cancelled without writing.
        """
        config = self.config
        while True:
            await anyio.sleep(config.heartbeat)
            self._give_up_overdue()
            held = {task_id: entry.fence for task_id, entry in self._held.items()}
            sent = anyio.current_time()
            renewal: Renewal | None = None
            try:
                async with self._gate.statement():
                    with anyio.move_on_after(config.heartbeat):  # never skip an interval's check
                        renewal = await self.worker.renew(list(held.values()), config.lease)
                if renewal is None:
                    raise DatabaseUnavailable(
                        f"lease renewal took longer than {config.heartbeat:g} s"
                    )
            except DatabaseUnavailable as exc:
                self._outage.failed(exc)
            except ToolkitError as exc:
                self._refused("heartbeat_failed", "heartbeat failed: %s", exc)
            if renewal is None:
                self._expire_overdue()
                continue
            self._outage.succeeded()
            if not renewal.registered:
                self._registration_lost()
            renewed = renewal.renewed
            self.metrics.lease_renewals.inc(len(renewed))
            lost: list[int] = []
            for task_id, fence in held.items():
                entry = self._held.get(task_id)
                if entry is None or entry.fence != fence:
                    continue  # that cycle ended meanwhile
                control = entry.control
                if control.lease_lost:
                    continue  # presumed lost already; its cycle is ending
                if task_id in renewal.ended:
                    continue  # its own last write ended the lease: the cycle is ending
                if task_id not in renewed:
                    lost.append(task_id)
                    control.lease_lost = True
                    entry.cancel()
                    continue
                control.lease_deadline = sent + config.lease
                if renewed[task_id] is not None and control.cancel_requested is None:
                    logger.info(
                        "cancel requested; cancelling the cycle",
                        extra={
                            "action": "cancel_requested", "task_id": task_id,
                            "token": fence.token,
                        },
                    )
                    control.cancel_requested = renewed[task_id]
                    entry.cancel()
            if lost:
                logger.warning(
                    "%d lease(s) lost at heartbeat (expired or taken over); cancelling their "
                    "cycles, which write nothing more: tasks %s",
                    len(lost),
                    _ids(lost),
                    extra={"action": "lease_lost", "task_ids": lost[:20]},
                )

    def _registration_lost(self) -> None:
        """Another process took this worker's id over (this one stalled past it): stop.

        Nothing was renewed: the cycles still running lose their leases at the next check
        (they write nothing more) and the run ends as at a shutdown, with the report saying
        why (``registration_lost``).
        """
        if self.report.registration_lost:
            return
        self.report.registration_lost = True
        logger.error(
            "worker id %r was registered by another process while this one was away (stalled "
            "past its registration); stopping: no two processes run under one id",
            self.worker.worker_id,
            extra={"action": "registration_lost", "worker_id": self.worker.worker_id},
        )
        self._shutdown.cancel()

    def _expire_overdue(self) -> None:
        """Cancel the cycles whose lease has not been renewed for a whole lease duration."""
        now = anyio.current_time()
        lost = []
        for task_id, entry in list(self._held.items()):
            control = entry.control
            if not control.lease_lost and now >= control.lease_deadline:
                lost.append(task_id)
                control.lease_lost = True
                entry.cancel()
        if lost:
            logger.info(
                "%d lease(s) not renewed for a whole lease duration are presumed lost; "
                "cancelling their cycles, which write nothing more: tasks %s",
                len(lost),
                _ids(lost),
                extra={"action": "lease_lost", "task_ids": lost[:20]},
            )

    async def _listen(self) -> None:
        await Listener(
            self.worker.store.db.dsn, self.config, self.metrics, self._wake_up, self._gate
        ).run()

    def _wake_up(self) -> None:
        self._wake.set()


def _ids(ids: list[int]) -> str:
    """Task ids for a log line: the first twenty, then how many more."""
    shown = ", ".join(map(str, ids[:20]))
    return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


@dataclasses.dataclass(eq=False)
class RunningCycle:
    """A cycle the supervisor runs, holding a task's lease.

    Each cycle is an asyncio task of its own, not a child of a task group: a cycle whose
    handler call ignores cancellation can be given up without holding the run up.

    Attributes:
        fence: the lease it holds.
        scope: its cancel scope.
        control: the supervisor's side of the cycle.
        runner: the asyncio task running it.
        cancelled_at: event-loop time it was first cancelled (infinity: not yet).
    """

    fence: Fence
    scope: anyio.CancelScope
    control: CycleControl
    runner: asyncio.Task[None]
    cancelled_at: float = math.inf

    def cancel(self) -> None:
        """Cancel the cycle (it ends its lease protocol), noting when."""
        self.cancelled_at = min(self.cancelled_at, anyio.current_time())
        self.scope.cancel()

    def overdue(self, now: float, grace: float) -> str | None:
        """Why the cycle is to be given up at event-loop time ``now``, or None.

        A handler call past its step's timeout plus ``grace`` seconds, or a cycle still
        running ``grace`` seconds after it was cancelled, ignores its cancellation.
        """
        late = [step for at, step in self.control.calls.values() if now >= at]
        if late:
            return f"its call of step {late[0]!r} ran past its timeout and {grace:g} s more"
        if self.cancelled_at + grace <= now:
            return f"it ran on {grace:g} s after it was cancelled"
        return None


def _report_fault(runner: asyncio.Task[None]) -> None:
    """Log a fault of a cycle's own code (the interpreter fails tasks, never raises)."""
    if not runner.cancelled() and runner.exception() is not None:
        logger.error(
            "a cycle ended with an error of the supervisor's", exc_info=runner.exception(),
            extra={"action": "cycle_fault"},
        )  # fmt: skip
