"""Latencies: an idle worker's submit → claim, and the claim path's statements.

- Idle latency: ONE worker process is started on an empty queue (without ``--until-idle``)
  and left until it listens on ``toolkit_wakeup`` and sits in its idle wait; then tasks are
  submitted one at a time through the store API, ``interval`` apart, and for each task the
  ``submitted`` → ``claimed`` (and → ``succeeded``) gap is read from ``toolkit_task_events``:
  both ends are database time (``clock_timestamp()``), so no clock is compared with another.
  The ``claimed`` event is written by the claim statement, just before the handler starts.
- Statement probe: the engine's own ``claim_tasks`` (rolled back, so nothing changes) and
  ``idle_state`` statements, timed from a client, prepared like the worker's (psycopg
  prepares a statement on its sixth execution).

Optionally the database first holds ``waiting`` tasks parked on a one-hour timer by a worker
(:func:`bench.processes.park_timers`), to see whether waiting timers cost anything.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, LiteralString

import anyio
import psycopg

from bench.processes import WorkerProcess, park_timers, summarise, worker_command
from bench.workload import (
    TIMER,
    Percentiles,
    Workload,
    counters,
    event_latency,
    percentiles,
    scratch_database,
    seed,
    server_cpu,
    wait_for_states,
    write_definitions,
)
from toolkit.store import Store, rotation
from toolkit.store.queries import query

#: The probe's claim batch: the worker's default at concurrency 32 and below (``toolkit
#: run --claim-batch``; ``SupervisorConfig.claim_size``), the target scenario's.
CLAIM_BATCH = 16
LEASE_SECONDS = 30.0
_LISTENING: LiteralString = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'idle' AND query = 'LISTEN toolkit_wakeup'
"""


@dataclasses.dataclass(frozen=True)
class IdleLatency:
    """Submit → claim of tasks submitted one at a time to an idle worker (milliseconds)."""

    waiting: int
    submits: int
    interval_ms: float
    to_claimed: Percentiles
    to_succeeded: Percentiles
    worker_peak_rss_mb: float
    worker_cpu_s: float
    #: Server transactions per submitted task while submitting (the submit and the worker's
    #: claims, idle checks and group commits; a few of the benchmark's own polls).
    xacts_per_task: float
    #: Server CPU per submitted task while submitting, milliseconds (None: not readable).
    server_cpu_ms_per_task: float | None


def measure_idle_latency(
    server: str,
    workload: Workload,
    *,
    submits: int,
    interval: float,
    concurrency: int,
    waiting: int = 0,
) -> IdleLatency:
    """Start one worker on an empty queue (but ``waiting`` parked timers), let it go idle,
    submit ``submits`` tasks ``interval`` seconds apart, then stop it with SIGTERM."""
    with (
        scratch_database(server, "bench_idle_latency") as dsn,
        tempfile.TemporaryDirectory(prefix="runifold-bench-") as folder,
    ):
        if waiting:
            park_timers(dsn, Path(folder) / "park", waiting)
        return idle_latency_on(
            dsn, Path(folder) / "run", workload, submits=submits, interval=interval,
            concurrency=concurrency, waiting=waiting,
        )  # fmt: skip


def idle_latency_on(
    dsn: str,
    folder: Path,
    workload: Workload,
    *,
    submits: int,
    interval: float,
    concurrency: int,
    waiting: int,
) -> IdleLatency:
    """:func:`measure_idle_latency` on a database already holding ``waiting`` parked timers
    (``folder``: where to write the worker's definitions)."""
    definitions = write_definitions(folder, [workload, TIMER] if waiting else [workload])
    seed(dsn, workload, 0)
    command = worker_command(dsn, definitions, concurrency, "bench-idle", until_idle=False)
    started = time.perf_counter()
    worker = WorkerProcess(command)
    try:
        _wait_until_listening(dsn, worker, timeout=60.0)
        time.sleep(0.5)  # past its first empty claims, into the idle wait
        before, cpu_before = counters(dsn), server_cpu(dsn)
        anyio.run(_submit_spaced, dsn, workload, submits, interval)
        expected = {"succeeded": submits, **({"waiting": waiting} if waiting else {})}
        wait_for_states(dsn, expected, timeout=60.0)
        cpu_after, after = server_cpu(dsn), counters(dsn)
    finally:
        worker.terminate()
        exited = worker.reap()
    run = summarise([exited], started)
    return IdleLatency(
        waiting=waiting,
        submits=submits,
        interval_ms=interval * 1000,
        to_claimed=event_latency(dsn, workload.name, "submitted", "claimed"),
        to_succeeded=event_latency(dsn, workload.name, "submitted", "succeeded"),
        worker_peak_rss_mb=run.peak_rss / 2**20,
        worker_cpu_s=run.cpu,
        xacts_per_task=(after - before).commits / submits,
        server_cpu_ms_per_task=None
        if cpu_before is None or cpu_after is None
        else (cpu_after - cpu_before) * 1000 / submits,
    )


def _wait_until_listening(dsn: str, worker: WorkerProcess, *, timeout: float) -> None:
    """Until the worker's LISTEN connection is open and idle."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(_LISTENING).fetchone()
        if row is not None and row[0]:
            return
        if not worker.running() or time.monotonic() > deadline:
            raise RuntimeError("the idle worker did not start listening")
        time.sleep(0.05)


async def _submit_spaced(dsn: str, workload: Workload, submits: int, interval: float) -> None:
    """One ``store.tasks.submit`` of one task every ``interval`` seconds (on a schedule)."""
    definition = workload.definition()
    async with await Store.open(dsn, pool_size=1, migrate_schema=False) as store:
        start = anyio.current_time()
        for index in range(submits):
            await anyio.sleep_until(start + index * interval)
            await store.tasks.submit(definition, [{"i": index}])


# --- statement probe --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StatementProbe:
    """Client-side latency of the claim path's statements (milliseconds)."""

    claim: Percentiles
    claimed: int
    idle_state: Percentiles


def probe_statements(
    dsn: str, digests: Sequence[str], *, samples: int = 100, warmup: int = 6
) -> StatementProbe:
    """Time ``claim_tasks`` (batch :data:`CLAIM_BATCH`, each in a rolled-back transaction)
    and ``idle_state`` with the worker's parameters, ``samples`` times after ``warmup``."""
    claim_params: dict[str, Any] = {
        "worker_id": "bench-probe",
        "digests": list(digests),
        "limit": CLAIM_BATCH,
        "lease_seconds": LEASE_SECONDS,
        "deferring": False,
        "locked": [],  # no limited tenant locked: the claim's one-statement path
        "window": rotation.window(CLAIM_BATCH),
        "per_tenant": rotation.per_tenant(CLAIM_BATCH),
        "tenant": None,
    }
    claim_ms: list[float] = []
    idle_ms: list[float] = []
    claimed = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for index in range(warmup + samples):
            with conn.transaction(force_rollback=True):
                began = time.perf_counter()
                rows = conn.execute(query("claim_tasks"), claim_params).fetchall()
                claimed = sum(1 for row in rows if row[0] is not None)
                claim_took = time.perf_counter() - began
            began = time.perf_counter()
            conn.execute(query("idle_state"), {"digests": list(digests)}).fetchall()
            idle_took = time.perf_counter() - began
            if index >= warmup:
                claim_ms.append(claim_took * 1000)
                idle_ms.append(idle_took * 1000)
    return StatementProbe(percentiles(claim_ms), claimed, percentiles(idle_ms))
