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

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable
from typing import LiteralString

import anyio
import psycopg
from psycopg.conninfo import make_conninfo

from toolkit.engine import CycleControl, CycleOutcome, Interpreter
from toolkit.errors import ConfigError, DatabaseUnavailable, ToolkitError
from toolkit.lifecycle import TaskState
from toolkit.metrics import WorkerMetrics
from toolkit.runtime.worker import Worker
from toolkit.store.database import redact_dsn
from toolkit.store.fence import Fence
from toolkit.store.group_commit import GroupCommit
from toolkit.store.leases import ClaimedTask, Renewal
from toolkit.store.writes import FencedWrite

logger = logging.getLogger(__name__)

WAKEUP_CHANNEL = "toolkit_wakeup"
_LISTEN: LiteralString = "LISTEN toolkit_wakeup"
#: The LISTEN connection's probe: a statement it must answer after a quiet interval.
_LISTEN_PROBE: LiteralString = "SELECT 1 AS toolkit_listen_probe"
#: TCP keepalives of the LISTEN connection (seconds; ignored on a Unix socket): the kernel
#: finds a peer gone quiet too, between two probes.
_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
               "keepalives_count": "3"}  # fmt: skip

#: The shortest heartbeat interval, seconds: shorter ones are a renewal storm, not safety.
MIN_HEARTBEAT = 0.05
#: The longest lease, heartbeat, grace or backoff a supervisor takes, seconds (a day).
MAX_SETTING = 86400.0
#: Seconds a worker waits at most to record itself stopped when the database is away.
UNREGISTER_TIMEOUT = 3.0
#: A failure this soon after the database came back is part of the same outage (stale
#: connections of the pool failing one by one), seconds.
OUTAGE_SETTLE = 1.0


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
        listen_probe: after this long without a notification, the LISTEN connection must
            answer a probe within as long again, or it is opened anew (a connection that
            stopped delivering without closing, behind a NAT or a proxy, is found).
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
    listen_probe: float = 10.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.claim_batch < 1:
            raise ConfigError(f"claim_batch must be at least 1, not {self.claim_batch}")
        _seconds("heartbeat", self.heartbeat, MIN_HEARTBEAT)
        _seconds("lease", self.lease, 3 * MIN_HEARTBEAT)
        _seconds("grace", self.grace, 0.0)
        _seconds("listen_probe", self.listen_probe, 0.0, strictly=True)
        _seconds("idle_backoff_min", self.idle_backoff_min, 0.0, strictly=True)
        _seconds("idle_backoff_max", self.idle_backoff_max, 0.0, strictly=True)
        if self.heartbeat > self.lease / 3:
            raise ConfigError(
                f"heartbeat interval {self.heartbeat:g} s must be at most a third of the "
                f"lease ({self.lease:g} s), so one late heartbeat does not lose every lease"
            )
        if not 0 < self.idle_backoff_min <= self.idle_backoff_max:
            raise ConfigError("idle backoff needs 0 < min <= max")
        if not 0 <= self.idle_jitter <= 1:
            raise ConfigError("idle_jitter must be between 0 and 1")


def _seconds(name: str, value: float, least: float, *, strictly: bool = False) -> None:
    """Refuse a duration that is not a finite number of seconds from ``least`` to a day.

    Raises:
        ConfigError: naming the setting (``--lease`` of ``toolkit run`` is ``lease``).
    """
    low = value > least if strictly else value >= least
    if not (isinstance(value, int | float) and math.isfinite(value) and low
            and value <= MAX_SETTING):  # fmt: skip
        bound = f"above {least:g}" if strictly else f"at least {least:g}"
        raise ConfigError(
            f"{name} must be a number of seconds {bound} and at most {MAX_SETTING:g}, "
            f"not {value!r}"
        )


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
        registration_lost: the run stopped because another process took its worker id over
            while it was away (see ``Worker.incarnation``).
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
    registration_lost: bool = False
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


class _Outage:
    """Whether the database is reachable, as every part of the supervisor sees it.

    The first failure of an outage logs one warning and counts one outage; the first success
    after it logs one line that it is back. Failures in between are silent. Failures within
    :data:`OUTAGE_SETTLE` seconds of a recovery (stale connections failing one by one) are
    announced only if they go on past that long.
    """

    def __init__(self, report: SupervisorReport, metrics: WorkerMetrics) -> None:
        self._report = report
        self._metrics = metrics
        self.down_since: float | None = None
        self._announced = False
        self._last_recovery = -float("inf")
        self.leases_lost = 0

    @property
    def down(self) -> bool:
        """True while the database is presumed unreachable."""
        return self.down_since is not None

    def failed(self, exc: BaseException) -> None:
        """A store call found the database unreachable."""
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            self._announced = False
        if self._announced:
            return
        if now - self._last_recovery < OUTAGE_SETTLE and now - self.down_since < OUTAGE_SETTLE:
            return  # maybe a straggler of the outage that just ended
        self._announced = True
        self.leases_lost = 0
        self._report.database_outages += 1
        self._metrics.database_outages.inc()
        logger.warning(
            "database unavailable; the worker keeps its leases while it can and tries again "
            "with backoff: %s",
            exc,
            extra={"action": "database_unavailable"},
        )

    def succeeded(self) -> None:
        """A store call went through."""
        if self.down_since is None:
            return
        now = time.monotonic()
        seconds = now - self.down_since
        self.down_since = None
        self._last_recovery = now
        if self._announced:
            logger.info(
                "database reachable again after %.1f s; leases lost meanwhile: %d",
                seconds,
                self.leases_lost,
                extra={"action": "database_back", "seconds": round(seconds, 3)},
            )


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
        #: Task id to the fence, cancel scope and control of the cycle holding its lease.
        self._held: dict[int, tuple[Fence, anyio.CancelScope, CycleControl]] = {}
        self._in_flight = 0
        self._wake = anyio.Event()
        self._drained = anyio.Event()
        self._group_commit = GroupCommit(worker.store.leases)
        self._outage = _Outage(self.report, self.metrics)
        self._claim_scope: anyio.CancelScope | None = None
        self._refusals: dict[str, str] = {}
        self._shutdown = CancellationToken()
        self._interpreter = Interpreter(
            worker.store, worker.app, worker.worker_id, self.metrics, self._commit
        )

    async def _commit(self, write: FencedWrite) -> TaskState:
        """The group commit, watched for outages."""
        try:
            state = await self._group_commit.commit(write)
        except DatabaseUnavailable as exc:
            self._outage.failed(exc)
            raise
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
                services.start_soon(self._watch_loop_lag)
                services.start_soon(self._watch_unavailable)
                async with anyio.create_task_group() as cycles:
                    await self._claim_loop(cycles, shutdown)
                    if self._in_flight:
                        with anyio.move_on_after(self.config.grace):
                            await self._drained.wait()
                    cycles.cancel_scope.cancel()
                self._group_commit.stop_soon(1.0)
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
        # A claim waiting for a connection during an outage would hold shutdown up until the
        # pool gives up. When the database is known away, stop waiting: were the claim to
        # have gone through, its leases lapse and other workers recover the tasks.
        if self._outage.down and self._claim_scope is not None:
            self._claim_scope.cancel()

    async def _claim_loop(self, cycles: anyio.abc.TaskGroup, shutdown: CancellationToken) -> None:
        config = self.config
        backoff = config.idle_backoff_min
        # Claim in batches: while cycles run, wait until a good share of the slots is free
        # rather than claiming one task each time one cycle ends.
        refill = max(1, min(config.claim_batch, config.concurrency) // 2)
        while not shutdown.cancelled:
            free = config.concurrency - self._in_flight
            if free <= 0 or (free < refill and self._in_flight > 0):
                await self._idle(None)
                continue
            next_due: float | None = None
            tasks: list[ClaimedTask] = []
            sent = anyio.current_time()
            try:
                with anyio.CancelScope() as self._claim_scope:
                    with self.metrics.claim_latency.time():
                        tasks = await self.worker.claim(min(free, config.claim_batch), config.lease)
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
                self._start_cycle(cycles, task, sent + config.lease)
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

    def _start_cycle(
        self, cycles: anyio.abc.TaskGroup, task: ClaimedTask, lease_deadline: float
    ) -> None:
        self.report.claimed += 1
        self.report.recovered += int(task.recovered)
        self.report.queue_delay_total += task.queue_delay
        name = self.worker.definition(task.digest).name
        self.metrics.queue_delay.labels(name).observe(max(task.queue_delay, 0.0))
        self.metrics.claimed.labels(name, str(task.recovered).lower()).inc()
        self.metrics.in_flight.inc()
        self._in_flight += 1
        self._drained = anyio.Event() if self._drained.is_set() else self._drained
        control = CycleControl(lease_deadline=lease_deadline)
        if task.deadline_in is not None and task.deadline_in > 0:
            # The workflow deadline (database time, as seconds left at the claim) stops a
            # running cycle like a cancellation; the next claim applies it.
            control.deadline = anyio.current_time() + task.deadline_in
        scope = anyio.CancelScope(deadline=control.deadline)
        stale = self._held.get(task.id)
        if stale is not None:  # this worker took over its own task: the old cycle lost it
            stale[2].lease_lost = True
            stale[1].cancel()
        self._held[task.id] = (task.fence(self.worker.worker_id), scope, control)
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
            held = self._held.get(task.id)
            if held is not None and held[0].token == task.token:
                del self._held[task.id]  # not a newer cycle's entry for the same task
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
            held = {task_id: entry[0] for task_id, entry in self._held.items()}
            sent = anyio.current_time()
            renewal: Renewal | None = None
            try:
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
                if entry is None or entry[0] != fence:
                    continue  # that cycle ended meanwhile
                _, scope, control = entry
                if control.lease_lost:
                    continue  # presumed lost already; its cycle is ending
                if task_id not in renewed:
                    lost.append(task_id)
                    control.lease_lost = True
                    scope.cancel()
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
                    scope.cancel()
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
        for task_id, (_, scope, control) in list(self._held.items()):
            if not control.lease_lost and now >= control.lease_deadline:
                lost.append(task_id)
                control.lease_lost = True
                scope.cancel()
        if lost:
            logger.info(
                "%d lease(s) not renewed for a whole lease duration are presumed lost; "
                "cancelling their cycles, which write nothing more: tasks %s",
                len(lost),
                _ids(lost),
                extra={"action": "lease_lost", "task_ids": lost[:20]},
            )

    async def _listen(self) -> None:
        """Wake the claim loop on NOTIFY; open the connection anew when it drops or goes dead.

        After ``listen_probe`` seconds without a notification the connection must answer a
        probe within as long again: one that stopped delivering without closing (a
        half-open TCP connection behind a NAT, a load balancer, a failed-over proxy) is
        found so, closed and opened again, LISTEN first and then a wake-up, so the claim
        that follows catches up on whatever came meanwhile. Never raises: while it cannot
        listen, polling with idle backoff finds new work.
        """
        delay = self.config.idle_backoff_min
        probe = self.config.listen_probe
        dsn = self.worker.store.db.dsn
        listening = make_conninfo(dsn, **_KEEPALIVES)
        opened = False
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    listening, autocommit=True, application_name="runifold", connect_timeout=10
                )
                async with conn:
                    await conn.execute(_LISTEN)
                    if opened:
                        self.metrics.listen_reconnects.inc()
                    opened = True
                    delay = self.config.idle_backoff_min
                    self._wake.set()  # anything submitted while we were not listening
                    while True:
                        async for _ in conn.notifies(timeout=probe):
                            self._wake.set()
                        with anyio.fail_after(probe):
                            await conn.execute(_LISTEN_PROBE)
            except TimeoutError:
                logger.warning(
                    "the LISTEN connection to %s did not answer its probe within %g s; "
                    "opening it again",
                    redact_dsn(dsn),
                    probe,
                    extra={"action": "listen_dead"},
                )
            except Exception as exc:  # psycopg errors, OSError ...: listen again later
                logger.debug(
                    "LISTEN connection to %s lost: %s",
                    redact_dsn(dsn),
                    exc,
                    extra={"action": "listen_lost"},
                )
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
            except ToolkitError:  # the claim loop and heartbeats report outages
                counts = None
            if counts is not None:
                gauge.clear()
                for (name, version), n in counts.items():
                    gauge.labels(name, str(version)).set(n)
            await anyio.sleep(self.UNAVAILABLE_REFRESH)


def _ids(ids: list[int]) -> str:
    """Task ids for a log line: the first twenty, then how many more."""
    shown = ", ".join(map(str, ids[:20]))
    return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
