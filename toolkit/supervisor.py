"""The supervisor: bounded claim-and-execute cycles, heartbeats, idle backoff, shutdown.

DESIGN §2 ("Supervisor") and §4 (the hot path). One :class:`WorkflowSupervisor` runs one
:class:`~toolkit.worker.Worker` with at most ``concurrency`` cycles at once. Idle workers are
woken by LISTEN/NOTIFY; polling with exponential backoff and jitter is the fallback. On
shutdown it claims nothing new, lets started cycles finish within a grace period, then
cancels the rest, which release their leases with a fenced write.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import LiteralString

import anyio
import psycopg

from toolkit.database import is_unavailable
from toolkit.engine import CycleControl, CycleOutcome, Interpreter
from toolkit.errors import ConfigError, DatabaseUnavailable
from toolkit.leases import ClaimedTask, GroupCommit
from toolkit.metrics import WorkerMetrics
from toolkit.worker import Worker

logger = logging.getLogger(__name__)

WAKEUP_CHANNEL = "toolkit_wakeup"
_LISTEN: LiteralString = "LISTEN toolkit_wakeup"


class CancellationToken:
    """A one-way flag that asks a supervisor to shut down gracefully.

    ``cancel()`` may be called from any task of the event loop (a signal handler task, a
    test); it is idempotent.
    """

    def __init__(self) -> None:
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Ask for shutdown."""
        if not self._cancelled:
            self._cancelled = True
            for callback in self._callbacks:
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` at cancellation (at once if already cancelled)."""
        self._callbacks.append(callback)
        if self._cancelled:
            callback()


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    """How a supervisor runs its worker. Durations are in seconds.

    Attributes:
        concurrency: cycles in flight at most (this process only; DESIGN §2).
        claim_batch: tasks claimed per claim statement at most.
        lease: lease duration.
        heartbeat: interval between lease renewals; at most a third of ``lease``.
        idle_backoff_min: first idle wait after an empty claim.
        idle_backoff_max: longest idle wait; it doubles from the minimum up to this.
        idle_jitter: fraction of the wait drawn at random (0 to 1).
        grace: how long a shutdown lets started cycles finish before cancelling them.
        until_idle: stop once no task of the loaded definitions is queued, leased, or waiting
            and due (a timer not yet due or a signal wait does not count).

    Raises:
        ConfigError: a value is out of range, or the heartbeat is not well below the lease.
    """

    concurrency: int = 8
    claim_batch: int = 16
    lease: float = 30.0
    heartbeat: float = 10.0
    idle_backoff_min: float = 0.05
    idle_backoff_max: float = 2.0
    idle_jitter: float = 0.25
    grace: float = 10.0
    until_idle: bool = False

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.claim_batch < 1:
            raise ConfigError(f"claim_batch must be at least 1, not {self.claim_batch}")
        if self.lease <= 0 or self.heartbeat <= 0:
            raise ConfigError("lease and heartbeat must be positive durations")
        if self.heartbeat > self.lease / 3:
            raise ConfigError(
                f"heartbeat interval {self.heartbeat:g} s must be at most a third of the "
                f"lease ({self.lease:g} s), so one late heartbeat does not lose every lease"
            )
        if not 0 < self.idle_backoff_min <= self.idle_backoff_max:
            raise ConfigError("idle backoff needs 0 < min <= max")
        if not 0 <= self.idle_jitter <= 1:
            raise ConfigError("idle_jitter must be between 0 and 1")


@dataclasses.dataclass
class SupervisorReport:
    """What a supervisor did, returned by :meth:`WorkflowSupervisor.run`.

    Attributes:
        worker_id: the worker's id.
        claimed: tasks claimed (takeovers included).
        recovered: claims of tasks whose previous lease had expired.
        cycles: claim-and-execute cycles finished.
        succeeded: cycles that ended the task ``succeeded``.
        failed: cycles that ended the task ``failed``.
        cancelled: cycles that ended the task ``cancelled``.
        waiting: cycles that left the task ``waiting``.
        retried: cycles that scheduled a retry.
        released: cycles released at shutdown.
        lease_lost: cycles that lost their lease.
        database_outages: times the database became unreachable.
        max_loop_lag: the longest event-loop stall seen, seconds.
        queue_delay_total: sum of queue delays of claimed tasks, seconds.
        wall_time: seconds from start to return.
    """

    worker_id: str
    claimed: int = 0
    recovered: int = 0
    cycles: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    waiting: int = 0
    retried: int = 0
    released: int = 0
    lease_lost: int = 0
    database_outages: int = 0
    max_loop_lag: float = 0.0
    queue_delay_total: float = 0.0
    wall_time: float = 0.0

    def count(self, outcome: CycleOutcome) -> None:
        """Count one finished cycle."""
        self.cycles += 1
        field = {
            CycleOutcome.SUCCEEDED: "succeeded",
            CycleOutcome.FAILED: "failed",
            CycleOutcome.CANCELLED: "cancelled",
            CycleOutcome.WAITING: "waiting",
            CycleOutcome.RETRY: "retried",
            CycleOutcome.RELEASED: "released",
            CycleOutcome.LEASE_LOST: "lease_lost",
        }.get(outcome)
        if field is not None:
            setattr(self, field, getattr(self, field) + 1)


class WorkflowSupervisor:
    """Runs one worker: claims, executes, heartbeats, and shuts down gracefully.

    Args:
        worker: the worker (store, app, definitions, id).
        config: concurrency, lease and backoff settings.
        metrics: where to record Prometheus metrics; default a new :class:`WorkerMetrics`
            (serve it with ``metrics.serve(port)``).
    """

    #: Seconds between two refreshes of the definition-unavailable gauge.
    UNAVAILABLE_REFRESH = 15.0

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
        self._held: dict[int, tuple[int, anyio.CancelScope, CycleControl]] = {}
        self._in_flight = 0
        self._wake = anyio.Event()
        self._drained = anyio.Event()
        self._group_commit = GroupCommit(worker.store.leases, worker.worker_id)
        self._interpreter = Interpreter(
            worker.store.leases,
            worker.app,
            worker.worker_id,
            worker.store.db.connection,
            self.metrics,
            self._group_commit.commit,
        )

    async def run(self, shutdown: CancellationToken | None = None) -> SupervisorReport:
        """Run until ``shutdown`` is cancelled (or, with ``until_idle``, the queue drains).

        Lifecycle: register the worker id and its definitions, then claim and execute; on
        shutdown stop claiming, give started cycles ``grace`` seconds to finish the lease
        protocol, cancel the rest (each releases its lease) and record the worker stopped.

        Returns:
            The report of this run.

        Raises:
            WorkerIdInUse: another live process holds this worker id.
            DefinitionConflict: a loaded definition conflicts with a registered one.
            DatabaseUnavailable: the database is unreachable at start.
        """
        shutdown = shutdown or CancellationToken()
        started = time.monotonic()
        config = self.config
        await self.worker.register(config.concurrency, config.lease, config.heartbeat)
        shutdown.on_cancel(lambda: self._wake.set())
        logger.info(
            "worker started",
            extra={"action": "worker_start", "worker_id": self.worker.worker_id},
        )
        try:
            async with anyio.create_task_group() as services:
                services.start_soon(self._group_commit.run)
                services.start_soon(self._heartbeats)
                services.start_soon(self._listen)
                services.start_soon(self._watch_loop_lag)
                services.start_soon(self._watch_unavailable)
                async with anyio.create_task_group() as cycles:
                    await self._claim_loop(cycles, shutdown)
                    if self._in_flight:
                        with anyio.move_on_after(self.config.grace):
                            await self._drained.wait()
                    cycles.cancel_scope.cancel()
                services.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.worker.unregister()
            self.report.wall_time = time.monotonic() - started
            logger.info(
                "worker stopped",
                extra={"action": "worker_stop", "worker_id": self.worker.worker_id},
            )
        return self.report

    async def _claim_loop(self, cycles: anyio.abc.TaskGroup, shutdown: CancellationToken) -> None:
        config = self.config
        backoff = config.idle_backoff_min
        outage = False
        # Claim in batches: while cycles run, wait until a good share of the slots is free
        # rather than claiming one task each time one cycle ends.
        refill = max(1, min(config.claim_batch, config.concurrency) // 2)
        while not shutdown.cancelled:
            free = config.concurrency - self._in_flight
            if free <= 0 or (free < refill and self._in_flight > 0):
                await self._idle(None)
                continue
            next_due: float | None = None
            try:
                with self.metrics.claim_latency.time():
                    tasks = await self.worker.claim(min(free, config.claim_batch), config.lease)
                if not tasks:
                    pending, next_due = await self.worker.idle_state()
                    if config.until_idle and self._in_flight == 0 and not pending:
                        return
            except DatabaseUnavailable as exc:
                if not outage:
                    outage = True
                    self.report.database_outages += 1
                    self.metrics.database_outages.inc()
                    logger.warning(
                        "database unavailable, retrying with backoff: %s",
                        exc,
                        extra={"action": "database_unavailable"},
                    )
                await self._idle(backoff)
                backoff = min(backoff * 2, config.idle_backoff_max)
                continue
            if outage:
                outage = False
                logger.info("database reachable again", extra={"action": "database_back"})
            for task in tasks:
                self._start_cycle(cycles, task)
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

    def _start_cycle(self, cycles: anyio.abc.TaskGroup, task: ClaimedTask) -> None:
        self.report.claimed += 1
        self.report.recovered += int(task.recovered)
        self.report.queue_delay_total += task.queue_delay
        name = self.worker.definition(task.digest).name
        self.metrics.queue_delay.labels(name).observe(max(task.queue_delay, 0.0))
        self.metrics.claimed.labels(name, str(task.recovered).lower()).inc()
        self.metrics.in_flight.inc()
        self._in_flight += 1
        self._drained = anyio.Event() if self._drained.is_set() else self._drained
        scope = anyio.CancelScope()
        control = CycleControl()
        self._held[task.id] = (task.token, scope, control)
        cycles.start_soon(self._cycle, task, scope, control)

    async def _cycle(
        self, task: ClaimedTask, scope: anyio.CancelScope, control: CycleControl
    ) -> None:
        outcome = CycleOutcome.RELEASED
        definition = self.worker.definition(task.digest)
        started = anyio.current_time()
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
            self._held.pop(task.id, None)
            self._in_flight -= 1
            self.report.count(outcome)
            self._observe(definition.name, outcome, anyio.current_time() - started)
            if self._in_flight == 0:
                self._drained.set()
            self._wake.set()

    def _observe(self, definition: str, outcome: CycleOutcome, seconds: float) -> None:
        metrics = self.metrics
        metrics.in_flight.dec()
        metrics.cycles.labels(definition, outcome.value).inc()
        metrics.cycle_duration.labels(definition, outcome.value).observe(seconds)
        if outcome is CycleOutcome.FAILED:
            metrics.failures.labels(definition).inc()
        elif outcome is CycleOutcome.LEASE_LOST:
            metrics.lease_losses.inc()

    async def _heartbeats(self) -> None:
        config = self.config
        while True:
            await anyio.sleep(config.heartbeat)
            held = {task_id: entry[0] for task_id, entry in self._held.items()}
            try:
                renewed = await self.worker.renew(held, config.lease)
            except DatabaseUnavailable as exc:
                logger.warning("heartbeat failed: %s", exc, extra={"action": "heartbeat_failed"})
                continue
            self.metrics.lease_renewals.inc(len(renewed))
            for task_id, token in held.items():
                entry = self._held.get(task_id)
                if entry is None or entry[0] != token:
                    continue  # that cycle ended meanwhile
                _, scope, control = entry
                if task_id not in renewed:
                    logger.warning(
                        "lease lost at heartbeat; cancelling the cycle",
                        extra={"action": "lease_lost", "task_id": task_id, "token": token},
                    )
                    control.lease_lost = True
                    scope.cancel()
                elif renewed[task_id] is not None and control.cancel_requested is None:
                    logger.info(
                        "cancel requested; cancelling the cycle",
                        extra={"action": "cancel_requested", "task_id": task_id, "token": token},
                    )
                    control.cancel_requested = renewed[task_id]
                    scope.cancel()

    async def _listen(self) -> None:
        """Wake the claim loop on NOTIFY; reconnect with backoff when the link drops."""
        delay = self.config.idle_backoff_min
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.worker.store.db.dsn, autocommit=True
                )
                async with conn:
                    await conn.execute(_LISTEN)
                    delay = self.config.idle_backoff_min
                    self._wake.set()  # anything submitted while we were not listening
                    async for _ in conn.notifies():
                        self._wake.set()
            except psycopg.Error as exc:
                if not is_unavailable(exc):
                    raise
            await anyio.sleep(delay)
            delay = min(delay * 2, self.config.idle_backoff_max)

    async def _watch_loop_lag(self) -> None:
        interval = 0.1
        while True:
            before = anyio.current_time()
            await anyio.sleep(interval)
            lag = max(anyio.current_time() - before - interval, 0.0)
            self.report.max_loop_lag = max(self.report.max_loop_lag, lag)
            self.metrics.loop_lag.observe(lag)

    async def _watch_unavailable(self) -> None:
        """Refresh the definition-unavailable gauge now and then (DESIGN §5)."""
        gauge = self.metrics.definition_unavailable
        while True:
            try:
                counts = await self.worker.store.definitions.unavailable()
            except DatabaseUnavailable:
                counts = None
            if counts is not None:
                gauge.clear()
                for (name, version), n in counts.items():
                    gauge.labels(name, str(version)).set(n)
            await anyio.sleep(self.UNAVAILABLE_REFRESH)
