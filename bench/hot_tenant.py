"""The hot-tenant run: does a small tenant get through while a big one floods the queue?

Real worker processes (``python -m toolkit run``, the production process tree, with the no-op
app ``bench/noop_app.py``) serve one-step no-op workflows. Three phases, on one database:

1. Idle: the cold tenant ``B`` submits ``--cold`` tasks to idle workers: B's queue delay on an
   idle system.
2. Hot: the hot tenant ``A`` submits ``--hot`` tasks (in chunks of 1,000), then ``B`` submits
   ``--cold`` tasks more at once, while the workers chew through A's backlog.
3. Drain: the workers finish A's backlog and are stopped (SIGTERM).

Queue delay is claim time minus submit time, both database time: the first ``claimed`` event
of a task against its ``created_at``. Reported: B's median and p95 delay during the hot
phase and on the idle system, A's backlog when B submitted, A's tasks claimed while B's were
waiting (A's progress) and A's own median delay; "FIFO estimate" is how long B would have
waited behind A's backlog with a first-come claim (A's backlog at B's submit over the
workers' throughput).

Run: ``.venv/bin/python bench/hot_tenant.py [--hot 20000] [--cold 100] [--workers 2]
[--concurrency 32] [--dsn SERVER_DSN] [--json PATH]``; without ``--dsn`` a temporary embedded
server is used. All numbers are measurements; nothing here asserts a timing (the test
``tests/process/test_hot_tenant.py`` runs a small version and asserts B gets through first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import psycopg

from bench.processes import WorkerProcess, worker_command
from bench.workload import SUBMIT_CHUNK, Workload, bench_server, scratch_database, write_definitions
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.migrations import migrate

WORKLOAD = Workload(1, idempotent=True)
HOT, COLD = "A", "B"

#: Per task of a tenant submitted at or after %(since)s: submit time and first claim, as
#: seconds since %(since)s, and the delay between them (ms).
_DELAYS = """
SELECT extract(epoch FROM t.created_at - %(since)s)::float8,
       extract(epoch FROM min(e.at) - %(since)s)::float8,
       extract(epoch FROM min(e.at) - t.created_at)::float8 * 1000
FROM toolkit_tasks t
JOIN toolkit_task_events e
  ON e.task_id = t.id AND e.tenant = t.tenant AND e.kind = 'claimed'
WHERE t.tenant = %(tenant)s AND t.created_at >= %(since)s
GROUP BY t.id, t.created_at
"""


@dataclasses.dataclass(frozen=True)
class Delays:
    """Queue delays of one batch of tasks, milliseconds."""

    count: int
    p50: float
    p95: float
    max: float

    def __str__(self) -> str:
        return f"p50 {self.p50:,.1f} ms, p95 {self.p95:,.1f} ms, max {self.max:,.1f} ms"


@dataclasses.dataclass(frozen=True)
class HotTenantResult:
    """What :func:`run_hot_tenant` measured.

    Attributes:
        hot: tasks tenant A submitted; cold: tasks tenant B submitted (each phase).
        workers: worker processes; concurrency: cycles per process.
        cold_idle: B's delays on the idle system.
        cold_hot: B's delays while A's backlog was being worked off.
        hot_delays: A's delays, over all its tasks.
        hot_backlog: A's tasks not yet claimed when B submitted.
        hot_claimed_meanwhile: A's tasks claimed between B's submit and B's last claim.
        cold_window: seconds from B's submit to B's last claim.
        throughput: tasks claimed per second while A's backlog lasted (both tenants).
        fifo_estimate: seconds B would have waited behind A's backlog with a first-come
            claim (``hot_backlog / throughput``).
    """

    hot: int
    cold: int
    workers: int
    concurrency: int
    cold_idle: Delays
    cold_hot: Delays
    hot_delays: Delays
    hot_backlog: int
    hot_claimed_meanwhile: int
    cold_window: float
    throughput: float
    fifo_estimate: float


def _delays(values_ms: Sequence[float]) -> Delays:
    ordered = sorted(values_ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return Delays(len(ordered), statistics.median(ordered), p95, ordered[-1])


def _query(dsn: str, text: str, params: dict[str, object] | None = None) -> list[tuple]:  # type: ignore[type-arg]
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(text, params).fetchall()  # type: ignore[arg-type]


def _wait(dsn: str, text: str, expected: object, *, timeout: float, what: str) -> None:
    """Poll a one-value query until it returns ``expected`` (a deadline, never a fixed pause)."""
    deadline = time.monotonic() + timeout
    while (found := _query(dsn, text)[0][0]) != expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what} (at {found})")
        time.sleep(0.02)


def _now(dsn: str) -> object:
    return _query(dsn, "SELECT clock_timestamp()")[0][0]


async def _submit(dsn: str, tenant: str, count: int) -> None:
    db = await Database.connect(dsn)
    try:
        store = Store(db)
        definition = WORKLOAD.definition()
        await store.definitions.deploy(definition)
        inputs = [{"i": index} for index in range(count)]
        for start in range(0, count, SUBMIT_CHUNK):
            await store.tasks.submit(
                definition, inputs[start : start + SUBMIT_CHUNK], tenant=tenant
            )
    finally:
        await db.close()


def submit(dsn: str, tenant: str, count: int) -> None:
    """Queue ``count`` one-step no-op tasks of ``tenant`` (chunks of :data:`SUBMIT_CHUNK`)."""
    anyio.run(_submit, dsn, tenant, count)


def run_hot_tenant(
    dsn: str, *, hot: int, cold: int, workers: int = 1, concurrency: int = 32, timeout: float = 300
) -> HotTenantResult:
    """Run the three phases on the migrated database ``dsn`` (see the module docstring).

    Raises:
        TimeoutError: a phase did not finish within ``timeout`` seconds.
        RuntimeError: a worker exited with an error.
    """
    with tempfile.TemporaryDirectory(prefix="runifold-hot-") as folder:
        definitions = write_definitions(Path(folder), [WORKLOAD])
        processes = [
            WorkerProcess(
                worker_command(dsn, definitions, concurrency, f"hot-{i}", until_idle=False)
            )
            for i in range(1, workers + 1)
        ]
        try:
            _wait(
                dsn,
                "SELECT count(*) FROM toolkit_workers WHERE stopped_at IS NULL",
                workers,
                timeout=60,
                what="the workers to register",
            )
            # 1. idle: B alone.
            idle_since = _now(dsn)
            submit(dsn, COLD, cold)
            _wait(dsn, _DONE, 0, timeout=timeout, what="B's tasks on the idle system")
            cold_idle = _tenant_delays(dsn, COLD, idle_since)
            # 2. hot: A's backlog, then B.
            hot_since = _now(dsn)
            submit(dsn, HOT, hot)
            submit(dsn, COLD, cold)
            # 3. drain.
            _wait(dsn, _DONE, 0, timeout=timeout, what="A's backlog to drain")
        finally:
            for process in processes:
                process.terminate()
            exits = [process.reap() for process in processes]
        for exited in exits:
            if exited.returncode != 0:
                raise RuntimeError(f"worker exited {exited.returncode}:\n{exited.stderr}")
    # Both tenants' times as seconds since A's submit (B's idle-phase tasks come before it).
    cold_rows = _query(dsn, _DELAYS, {"tenant": COLD, "since": hot_since})
    hot_rows = _query(dsn, _DELAYS, {"tenant": HOT, "since": hot_since})
    assert len(cold_rows) == cold and len(hot_rows) == hot, (len(cold_rows), len(hot_rows))
    cold_submit = min(row[0] for row in cold_rows)
    cold_last = max(row[1] for row in cold_rows)
    hot_backlog = sum(1 for row in hot_rows if row[1] > cold_submit)
    meanwhile = sum(1 for row in hot_rows if cold_submit < row[1] <= cold_last)
    hot_last = max(row[1] for row in hot_rows)
    first_claim = min(row[1] for row in hot_rows)
    throughput = (hot + cold) / max(hot_last - first_claim, 1e-9)
    return HotTenantResult(
        hot=hot,
        cold=cold,
        workers=workers,
        concurrency=concurrency,
        cold_idle=cold_idle,
        cold_hot=_delays([row[2] for row in cold_rows]),
        hot_delays=_delays([row[2] for row in hot_rows]),
        hot_backlog=hot_backlog,
        hot_claimed_meanwhile=meanwhile,
        cold_window=cold_last - cold_submit,
        throughput=throughput,
        fifo_estimate=hot_backlog / throughput,
    )


_DONE = "SELECT count(*) FROM toolkit_tasks WHERE state IN ('queued', 'leased')"


def _tenant_delays(dsn: str, tenant: str, since: object) -> Delays:
    rows = _query(dsn, _DELAYS, {"tenant": tenant, "since": since})
    return _delays([row[2] for row in rows])


def report(result: HotTenantResult) -> str:
    """The result as readable lines."""
    r = result
    return "\n".join([
        f"hot tenant: A {r.hot:,} tasks, then B {r.cold:,}; {r.workers} worker process(es) x "
        f"concurrency {r.concurrency}, one-step no-op workflows",
        f"B, idle system:         {r.cold_idle}",
        f"B, behind A's backlog:  {r.cold_hot}",
        f"A's backlog at B's submit: {r.hot_backlog:,} tasks; FIFO estimate of B's wait: "
        f"{r.fifo_estimate * 1000:,.0f} ms",
        f"A's progress while B waited ({r.cold_window * 1000:,.0f} ms, B submit to B's last "
        f"claim): {r.hot_claimed_meanwhile:,} tasks claimed",
        f"A, all tasks:           {r.hot_delays}",
        f"throughput while A's backlog lasted: {r.throughput:,.0f} tasks/s",
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--hot", type=int, default=20_000, help="tenant A's tasks (20000)")
    parser.add_argument("--cold", type=int, default=100, help="tenant B's tasks (100)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=32, help="per process (32)")
    parser.add_argument("--dsn", help="server DSN (default: a temporary embedded server)")
    parser.add_argument("--json", type=Path, help="write the result to this file")
    args = parser.parse_args(argv)
    with bench_server(args.dsn) as server, scratch_database(server, "bench_hot_tenant") as dsn:
        anyio.run(_migrate, dsn)
        result = run_hot_tenant(
            dsn, hot=args.hot, cold=args.cold, workers=args.workers, concurrency=args.concurrency
        )
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")


async def _migrate(dsn: str) -> None:
    db = await Database.connect(dsn)
    try:
        await migrate(db)
    finally:
        await db.close()


if __name__ == "__main__":
    main()
