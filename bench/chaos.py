"""Chaos run: real workers, real faults, then the fencing audit and the effect ledger.

N workflows (``bench/chaos_app.py``: idempotent and non-idempotent effects, a choice, a
durable timer of 1-3 s, a signal wait answered by this harness) run on three worker
processes (``python -m toolkit run``, lease 2 s, heartbeat 0.5 s), restarted whenever they
die. Faults are drawn from ``--seed``:

- ``kill``: SIGKILL a worker (it is restarted under a new worker id);
- ``stop``: SIGSTOP a worker for longer than the lease, then SIGCONT;
- ``terminate``: ``pg_terminate_backend`` of every worker connection (``application_name =
  'runifold'``) to the run's database;
- ``restart``: restart the PostgreSQL server once: the embedded one (``stop_embedded`` then
  ``start_embedded`` of its home; it keeps its socket), or a system server given with
  ``--dsn`` only with ``--allow-server-restart`` (``pg_ctlcluster``).

Then faults stop, stopped workers continue, and the run drains until every task is settled
(terminal, or waiting for reconciliation) or the drain deadline passes. Non-idempotent
effects left uncertain by a crash wait for reconciliation and are counted, not resolved:
that is the fail-closed case. Finally the audit (``toolkit.history.audit``) checks every history and
the ledger tells how often each effect really ran. The last stdout line is the figure line::

    chaos: seed S, N submitted, T terminal (F failed), R in reconciliation, L lost,
    non-idempotent effects run more than once: X, stale-token commits: Y, other audit
    violations: V, idempotent re-executions: Z, faults: kill=a stop=b terminate=c restart=d,
    wall W s

(on one line). L, X, Y and V must be 0; the exit status is 1 when one is not. Progress and
diagnostics go to stderr.

Run: ``.venv/bin/python bench/chaos.py [--short | --long] [--seed S] [--tasks N]
[--dsn DSN [--allow-server-restart]] [--citus-dsn DSN [--shards S]] [--keep]``. Without
``--dsn``, a temporary embedded server is started and stopped. Every run uses a scratch
database of its own, but with ``--citus-dsn``: that database of a Citus coordinator, laid out
again (``toolkit db migrate --distribute``; issue 25), without the server restart fault.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any, LiteralString

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from bench.chaos_app import CREATE_LEDGER, SIGNAL, WORKFLOW
from bench.citus import drop_toolkit_objects, tasks_per_node
from bench.workload import bench_server, scratch_database, with_dbname
from toolkit.definition import WorkflowDefinition, parse_definition
from toolkit.errors import DatabaseUnavailable, TaskTerminal
from toolkit.history.audit import AuditReport, audit_all
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.distribution import distribute
from toolkit.store.embedded import stop_embedded
from toolkit.store.migrations import migrate

REPO = Path(__file__).resolve().parents[1]
APP = "bench.chaos_app"
FAULT_KINDS = ("kill", "stop", "terminate")
SETTLED_SQL: LiteralString = """
SELECT count(*) AS submitted,
       count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'cancelled')) AS terminal,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'waiting' AND wait_reason = 'reconciliation')
           AS reconciliation
FROM toolkit_tasks"""
LEDGER_SQL: LiteralString = """
SELECT count(*) FILTER (WHERE NOT idempotent AND calls > 1) AS repeated_once,
       coalesce(sum(calls - 1) FILTER (WHERE idempotent), 0) AS reexecuted
FROM chaos_ledger"""
TERMINATE_SQL: LiteralString = """
SELECT count(pg_terminate_backend(pid))
FROM pg_stat_activity
WHERE application_name = 'runifold' AND datname = current_database()
  AND pid <> pg_backend_pid()"""
UNCERTAIN_SQL: LiteralString = """
SELECT count(*) FILTER (WHERE l.calls IS NOT NULL) AS called,
       count(*) FILTER (WHERE l.calls IS NULL) AS not_called
FROM toolkit_tasks t
LEFT JOIN chaos_ledger l ON l.idempotency_key = t.id || ':' || (t.checkpoint ->> 'pending')
WHERE t.state = 'waiting' AND t.wait_reason = 'reconciliation'"""
UNSETTLED_SQL: LiteralString = """
SELECT t.id, t.tenant, t.state, t.wait_reason, t.lease_owner, t.lease_token, t.attempts,
       round(extract(epoch FROM t.lease_expires_at - clock_timestamp())::numeric, 1)
           AS lease_expires_in,
       round(extract(epoch FROM t.run_at - clock_timestamp())::numeric, 1) AS due_in,
       t.cancel_requested IS NOT NULL AS cancel_requested,
       tn.ready AS tenant_ready,
       round(extract(epoch FROM tn.next_due - clock_timestamp())::numeric, 1)
           AS tenant_next_due_in,
       t.checkpoint ->> 'cursor' AS cursor, t.checkpoint ->> 'pending' AS pending,
       t.checkpoint -> 'wait' AS wait,
       (SELECT array_agg(s.name || CASE WHEN s.consumed_at IS NULL THEN '' ELSE '(consumed)' END
                         ORDER BY s.id)
        FROM toolkit_signals s WHERE s.task_id = t.id AND s.tenant = t.tenant) AS signals,
       (SELECT array_agg(e.kind || ':' || coalesce(e.worker_id, '-') || ':'
                         || coalesce(e.fencing_token::text, '-') ORDER BY e.id)
        FROM (SELECT * FROM toolkit_task_events x WHERE x.task_id = t.id AND x.tenant = t.tenant
              ORDER BY x.id DESC LIMIT 12) e) AS last_events
FROM toolkit_tasks t
LEFT JOIN toolkit_tenants tn ON tn.tenant = t.tenant
WHERE t.state NOT IN ('succeeded', 'failed', 'cancelled')
  AND NOT (t.state = 'waiting' AND t.wait_reason = 'reconciliation')
ORDER BY t.id"""
FAILED_SQL: LiteralString = """
SELECT error ->> 'name' AS name, error ->> 'step' AS step, count(*)
FROM toolkit_tasks WHERE state = 'failed' GROUP BY 1, 2 ORDER BY 3 DESC"""
#: Restart the embedded server from a fresh process: ``start_embedded`` in a process that
#: already started (and then stopped) the server returns its stale handle (see the report).
RESTART_EMBEDDED = (
    "import sys; from toolkit.store.embedded import start_embedded, stop_embedded; "
    "stop_embedded(sys.argv[1]); start_embedded(sys.argv[1])"
)


# --- configuration ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChaosConfig:
    """One chaos run. Durations are seconds.

    Attributes:
        seed: seeds the workload and every fault decision.
        tasks: workflows submitted.
        submit_seconds: submissions are spread over this long.
        fault_seconds: faults are injected this long at most (less if all settle first).
        fault_gap: (min, max) pause between two faults.
        drain_seconds: after the faults, how long the run may take to settle.
        workers: worker processes.
        concurrency: cycles per worker.
        lease: lease duration of the workers.
        heartbeat: heartbeat interval of the workers.
        signal_delay: (min, max) delay from a task's submission to its signal.
        tenants: the tasks are submitted round-robin to this many tenants (``chaos-0``,
            ``chaos-1``, ...; one: the ``default`` tenant).
    """

    seed: int
    tasks: int
    submit_seconds: float
    fault_seconds: float
    fault_gap: tuple[float, float]
    drain_seconds: float
    workers: int = 3
    concurrency: int = 8
    lease: float = 2.0
    heartbeat: float = 0.5
    signal_delay: tuple[float, float] = (0.0, 6.0)
    tenants: int = 1


MODES: dict[str, dict[str, Any]] = {
    "short": dict(tasks=60, submit_seconds=10, fault_seconds=30, fault_gap=(1.0, 2.0),
                  drain_seconds=25),
    "default": dict(tasks=500, submit_seconds=100, fault_seconds=130, fault_gap=(1.5, 4.0),
                    drain_seconds=60),
    "long": dict(tasks=2000, submit_seconds=480, fault_seconds=520, fault_gap=(2.0, 6.0),
                 drain_seconds=120, concurrency=16),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault: seconds from the start of the run, and its kind."""

    at: float
    kind: str


def fault_schedule(config: ChaosConfig, rng: random.Random, restart: bool) -> list[Fault]:
    """The seeded faults of a run, in time order.

    The first three are one of each of kill, stop and terminate (shuffled), so even a short
    run sees each; the server restart, when allowed, falls in the middle of the submissions.
    """
    first = list(FAULT_KINDS)
    rng.shuffle(first)
    faults: list[Fault] = []
    at = 1.0
    while True:
        at += rng.uniform(*config.fault_gap)
        if at >= config.fault_seconds:
            break
        kind = first.pop(0) if first else rng.choice(FAULT_KINDS)
        faults.append(Fault(at, kind))
    if restart:
        faults.append(Fault(config.submit_seconds * rng.uniform(0.4, 0.8), "restart"))
    return sorted(faults, key=lambda fault: fault.at)


@dataclasses.dataclass(frozen=True)
class Submission:
    """One task of the workload: its input, and when it is submitted and signalled."""

    index: int
    input: dict[str, int]
    submit_at: float
    signal_after: float
    tenant: str = "default"


def workload(config: ChaosConfig, rng: random.Random) -> list[Submission]:
    """The seeded workload: inputs, submission times spread evenly, signal delays."""
    step = config.submit_seconds / max(config.tasks, 1)
    return [
        Submission(
            index=index,
            input={"timer": rng.choice((1, 2, 3)), "ms": rng.randint(0, 150)},
            submit_at=index * step,
            signal_after=rng.uniform(*config.signal_delay),
            tenant=f"chaos-{index % config.tenants}" if config.tenants > 1 else "default",
        )
        for index in range(config.tasks)
    ]


# --- the database as the harness sees it ---------------------------------------------------------


async def fetch(dsn: str, statement: LiteralString) -> list[dict[str, Any]] | None:
    """Run one statement on a connection of its own; None when the database is unreachable.

    The harness's own connections are named ``runifold-chaos``: the terminate fault spares
    them.
    """
    try:
        async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, connect_timeout=3, application_name="runifold-chaos"
        ) as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(statement)
            return await cursor.fetchall() if cursor.description else []
    except psycopg.OperationalError:
        return None


async def prepare(dsn: str, definition: WorkflowDefinition, shards: int | None = None) -> None:
    """Migrate the scratch database (and distribute it over ``shards`` shards a table, on a
    Citus cluster), create the ledger, deploy the definition."""
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        if shards is not None:
            await distribute(db, shards=shards)
        async with db.connection() as conn:
            await conn.execute(CREATE_LEDGER)
        await Store(db).definitions.deploy(definition)
    finally:
        await db.close()


# --- worker processes ----------------------------------------------------------------------------


@dataclasses.dataclass
class Slot:
    """One of the worker processes, restarted under a new id each time it dies."""

    number: int
    process: subprocess.Popen[bytes] | None = None
    generation: int = 0
    stopped: bool = False
    killed: bool = False
    started_at: float = 0.0

    @property
    def worker_id(self) -> str:
        return f"chaos-{self.number}.{self.generation}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Workers:
    """The worker processes: start, restart when dead, kill, stop, continue, shut down."""

    #: Seconds at least between two starts of one slot (a dead server fails them at once).
    RESTART_PAUSE = 0.5

    def __init__(self, config: ChaosConfig, dsn: str, definitions: Path, logs: Path) -> None:
        self._config = config
        self._dsn = dsn
        self._definitions = definitions
        self._logs = logs
        self.slots = [Slot(number) for number in range(1, config.workers + 1)]
        self.starts = 0
        self.exits: collections.Counter[str] = collections.Counter()
        self._log_files: list[IO[bytes]] = []

    def command(self, slot: Slot) -> list[str]:
        config = self._config
        return [
            sys.executable, "-m", "toolkit", "run", "--app", APP,
            "--definitions", str(self._definitions), "--worker-id", slot.worker_id,
            "--lease", str(config.lease), "--heartbeat", str(config.heartbeat),
            "--concurrency", str(config.concurrency), "--grace", "1",
        ]  # fmt: skip

    def start(self, slot: Slot) -> None:
        slot.generation += 1
        env = {
            **os.environ,
            "TOOLKIT_DSN": self._dsn,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        log = (self._logs / f"worker-{slot.number}.log").open("ab")
        self._log_files.append(log)
        log.write(f"--- start {slot.worker_id}\n".encode())
        log.flush()
        slot.process = subprocess.Popen(
            self.command(slot), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
        slot.stopped = slot.killed = False
        slot.started_at = time.monotonic()
        self.starts += 1

    def keep(self) -> None:
        """Reap dead workers and start them again (not more often than ``RESTART_PAUSE``)."""
        for slot in self.slots:
            if slot.process is None:
                self.start(slot)
                continue
            code = slot.process.poll()
            if code is None or time.monotonic() - slot.started_at < self.RESTART_PAUSE:
                continue
            self.exits["killed" if slot.killed else f"exit {code}"] += 1
            self.start(slot)

    def pick(self, rng: random.Random) -> Slot | None:
        candidates = [slot for slot in self.slots if slot.running and not slot.stopped]
        return rng.choice(candidates) if candidates else None

    def kill(self, slot: Slot) -> None:
        assert slot.process is not None
        slot.killed = True
        slot.process.send_signal(signal.SIGKILL)

    async def stop_for(self, slot: Slot, seconds: float) -> None:
        assert slot.process is not None
        slot.stopped = True
        slot.process.send_signal(signal.SIGSTOP)
        try:
            await anyio.sleep(seconds)
        finally:
            self.cont(slot)

    def cont(self, slot: Slot) -> None:
        if slot.stopped and slot.process is not None and slot.process.poll() is None:
            slot.process.send_signal(signal.SIGCONT)
        slot.stopped = False

    def shutdown(self, timeout: float = 15.0) -> None:
        """SIGCONT and SIGTERM every worker; SIGKILL those still up after ``timeout``."""
        for slot in self.slots:
            self.cont(slot)
            if slot.running:
                assert slot.process is not None
                slot.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            if slot.process is None:
                continue
            try:
                slot.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.process.kill()
                slot.process.wait()
        for log in self._log_files:
            log.close()

    def tracebacks(self) -> int:
        """Tracebacks written by workers to their logs."""
        return sum(
            path.read_text(errors="replace").count("Traceback")
            for path in self._logs.glob("worker-*.log")
        )


# --- the run -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Server:
    """Where the run's database lives and how to restart the server, if allowed."""

    dsn: str
    home: str | None = None
    allow_restart: bool = False

    @property
    def can_restart(self) -> bool:
        return self.home is not None or self.allow_restart

    async def restart(self) -> None:
        if self.home is not None:
            command = [sys.executable, "-c", RESTART_EMBEDDED, self.home]
        else:
            command = ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        await anyio.run_process(command, env=env, cwd=REPO, check=True)


@dataclasses.dataclass
class Figures:
    """What the run measured; :meth:`line` is the figure line."""

    seed: int
    submitted: int = 0
    terminal: int = 0
    failed: int = 0
    reconciliation: int = 0
    repeated_once: int = 0
    reexecuted: int = 0
    audit: AuditReport | None = None
    faults: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    wall: float = 0.0

    @property
    def lost(self) -> int:
        return self.submitted - self.terminal - self.reconciliation

    @property
    def stale(self) -> int:
        return self.audit.stale_token_commits if self.audit is not None else 0

    @property
    def other_violations(self) -> int:
        return len(self.audit.violations) - self.stale if self.audit is not None else 0

    @property
    def ok(self) -> bool:
        must_be_zero = (self.lost, self.repeated_once, self.stale, self.other_violations)
        return self.audit is not None and not any(must_be_zero)

    def line(self) -> str:
        faults = " ".join(f"{kind}={self.faults[kind]}" for kind in (*FAULT_KINDS, "restart"))
        return (
            f"chaos: seed {self.seed}, {self.submitted} submitted, {self.terminal} terminal "
            f"({self.failed} failed), {self.reconciliation} in reconciliation, {self.lost} lost, "
            f"non-idempotent effects run more than once: {self.repeated_once}, "
            f"stale-token commits: {self.stale}, other audit violations: "
            f"{self.other_violations}, idempotent re-executions: {self.reexecuted}, "
            f"faults: {faults}, wall {self.wall:.1f} s"
        )


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ChaosRun:
    """One run: submitter, signaller, fault injector and keeper of the workers."""

    def __init__(self, config: ChaosConfig, server: Server, dsn: str, workers: Workers) -> None:
        self.config = config
        self.server = server
        self.dsn = dsn
        self.workers = workers
        self.figures = Figures(config.seed)
        rng = random.Random(config.seed)
        self.submissions = workload(config, random.Random(rng.random()))
        self.faults = fault_schedule(config, random.Random(rng.random()), server.can_restart)
        self.fault_rng = random.Random(rng.random())
        self.signal_at: dict[int, float] = {}
        self.started = 0.0
        self.settled = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def run(self, store: Store, definition: WorkflowDefinition) -> Figures:
        """Submit under faults, stop the faults, drain, stop the workers."""
        self.started = time.monotonic()
        async with anyio.create_task_group() as background:
            background.start_soon(self._keep_workers)
            background.start_soon(self._signal, store)
            background.start_soon(self._watch)
            faults = anyio.CancelScope()
            background.start_soon(self._inject, faults, background)
            await self._submit(store, definition)
            with anyio.move_on_after(max(0.0, self.config.fault_seconds - self.elapsed())):
                await self._until_settled()
            faults.cancel()
            for slot in self.workers.slots:
                self.workers.cont(slot)
            note(f"chaos: faults over at {self.elapsed():.0f} s; draining")
            with anyio.move_on_after(self.config.drain_seconds):
                await self._until_settled()
            background.cancel_scope.cancel()
        self.workers.shutdown()
        self.figures.wall = self.elapsed()
        return self.figures

    async def _submit(self, store: Store, definition: WorkflowDefinition) -> None:
        """Submit the workload on schedule, with keyed submits (a retry is harmless)."""
        for item in self.submissions:
            await anyio.sleep(max(0.0, item.submit_at - self.elapsed()))
            while True:
                try:
                    task_id, _ = await store.tasks.submit_keyed(
                        definition, item.input, key=f"chaos-{item.index}", tenant=item.tenant
                    )
                    break
                except DatabaseUnavailable:
                    await anyio.sleep(0.2)
            self.signal_at[task_id] = self.elapsed() + item.signal_after

    async def _signal(self, store: Store) -> None:
        """Send each task its signal once its delay has passed (again if unsure it arrived)."""
        while True:
            now = self.elapsed()
            for task_id, due in list(self.signal_at.items()):
                if due > now:
                    continue
                try:
                    await store.tasks.signal(task_id, SIGNAL, {"by": "chaos"})
                except TaskTerminal:
                    pass
                except DatabaseUnavailable:
                    continue
                del self.signal_at[task_id]
            await anyio.sleep(0.25)

    async def _inject(self, scope: anyio.CancelScope, group: anyio.abc.TaskGroup) -> None:
        """Run the fault schedule until ``scope`` is cancelled."""
        with scope:
            for fault in self.faults:
                await anyio.sleep(max(0.0, fault.at - self.elapsed()))
                if await self._fault(fault.kind, group):
                    self.figures.faults[fault.kind] += 1

    async def _fault(self, kind: str, group: anyio.abc.TaskGroup) -> bool:
        if kind == "restart":
            note(f"chaos: {self.elapsed():.1f} s: restarting the server")
            with anyio.CancelScope(shield=True):  # never leave the server down
                await self.server.restart()
            note(f"chaos: {self.elapsed():.1f} s: the server is back")
            return True
        if kind == "terminate":
            return await fetch(self.dsn, TERMINATE_SQL) is not None
        slot = self.workers.pick(self.fault_rng)
        if slot is None:
            return False
        if kind == "kill":
            self.workers.kill(slot)
        else:
            pause = self.config.lease + self.fault_rng.uniform(0.5, 2.0)
            group.start_soon(self.workers.stop_for, slot, pause)
        return True

    async def _keep_workers(self) -> None:
        while True:
            self.workers.keep()
            await anyio.sleep(0.2)

    async def _watch(self) -> None:
        """Track whether every task is settled; report progress every ten seconds."""
        last_note = 0.0
        while True:
            rows = await fetch(self.dsn, SETTLED_SQL)
            if rows:
                row = rows[0]
                done = row["terminal"] + row["reconciliation"]
                self.settled = done == row["submitted"] == self.config.tasks
                if self.elapsed() - last_note >= 10:
                    last_note = self.elapsed()
                    note(
                        f"chaos: {self.elapsed():.0f} s, {row['submitted']} submitted, "
                        f"{row['terminal']} terminal, {row['reconciliation']} in "
                        f"reconciliation, faults {dict(self.figures.faults)}"
                    )
            await anyio.sleep(0.5)

    async def _until_settled(self) -> None:
        while not self.settled:
            await anyio.sleep(0.2)


async def measure(dsn: str, figures: Figures) -> None:
    """Fill in the figures from the store, the ledger and the audit (workers stopped)."""
    rows = await fetch(dsn, SETTLED_SQL)
    ledger = await fetch(dsn, LEDGER_SQL)
    assert rows and ledger, "the database is unreachable at the end of the run"
    figures.submitted = rows[0]["submitted"]
    figures.terminal = rows[0]["terminal"]
    figures.failed = rows[0]["failed"]
    figures.reconciliation = rows[0]["reconciliation"]
    figures.repeated_once = ledger[0]["repeated_once"]
    figures.reexecuted = int(ledger[0]["reexecuted"])
    db = await Database.connect(dsn)
    try:
        figures.audit = await audit_all(db)
    finally:
        await db.close()
    uncertain = await fetch(dsn, UNCERTAIN_SQL) or [{}]
    note(
        f"chaos: in reconciliation: {uncertain[0].get('called')} whose call did happen, "
        f"{uncertain[0].get('not_called')} whose call did not (per the ledger)"
    )
    for task in await fetch(dsn, UNSETTLED_SQL) or []:
        note(f"chaos: unsettled task: {task}")
    for failure in await fetch(dsn, FAILED_SQL) or []:
        note(f"chaos: failed tasks: {failure}")
    for violation in figures.audit.violations[:20]:
        note(f"chaos: audit: {violation}")
    kinds = {str(kind): n for kind, n in figures.audit.by_kind.items() if n}
    if kinds:
        note(f"chaos: audit violations by kind: {kinds}")


@contextlib.contextmanager
def run_folder(keep: bool) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="chaos-"))
    try:
        yield folder
    finally:
        if keep:
            note(f"chaos: logs kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def harness_store(dsn: str) -> AsyncIterator[Store]:
    store = await Store.open(dsn, pool_size=4, migrate_schema=False)
    try:
        yield store
    finally:
        await store.close()


async def chaos(
    config: ChaosConfig, server: Server, dsn: str, folder: Path, shards: int | None = None
) -> Figures:
    definition = parse_definition(WORKFLOW, source="<chaos>")
    await prepare(dsn, definition, shards)
    path = folder / "chaos.yaml"
    path.write_text(WORKFLOW)
    workers = Workers(config, dsn, path, folder)
    try:
        async with harness_store(dsn) as store:
            figures = await ChaosRun(config, server, dsn, workers).run(store, definition)
    finally:
        workers.shutdown()
    note(
        f"chaos: worker starts {workers.starts}, exits {dict(workers.exits)}, "
        f"tracebacks in worker logs {workers.tracebacks()}"
    )
    await measure(dsn, figures)
    return figures


def parse_args(argv: list[str] | None = None) -> tuple[ChaosConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--short", action="store_true", help="N=60, about a minute")
    mode.add_argument("--long", action="store_true", help="N=2000, about ten minutes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tasks", type=int, help="override the mode's number of workflows")
    parser.add_argument("--dsn", help="a server to use; default: a temporary embedded one")
    parser.add_argument(
        "--allow-server-restart",
        action="store_true",
        help="with --dsn: restart it once (pg_ctlcluster --skip-systemctl-redirect 15 main)",
    )
    parser.add_argument(
        "--citus-dsn",
        help="run on this database of a Citus coordinator instead (its toolkit tables are"
        " dropped, then migrated and distributed; no server restart)",
    )
    parser.add_argument("--shards", type=int, default=4, help="with --citus-dsn: per table")
    parser.add_argument(
        "--tenants",
        type=int,
        help="submit to this many tenants (default: 1, or 8 with --citus-dsn, so that the"
        " tasks spread over the worker nodes)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the database and the logs (and the embedded server running)",
    )
    args = parser.parse_args(argv)
    settings = dict(MODES["short" if args.short else "long" if args.long else "default"])
    if args.tasks is not None:
        settings["tasks"] = args.tasks
    settings["tenants"] = args.tenants or (8 if args.citus_dsn else 1)
    return ChaosConfig(seed=args.seed, **settings), args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    # The harness's own pool reconnects through every fault; its notes would drown the run's.
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)
    home = None if args.dsn else tempfile.mkdtemp(prefix="chaos-pg-")
    try:
        with bench_server(args.dsn, home) as server_dsn, run_folder(args.keep) as folder:
            server = Server(server_dsn, home, args.allow_server_restart)
            if not server.can_restart:
                note("chaos: no server restart (a --dsn server without --allow-server-restart)")
            name = f"chaos_{config.seed}_{os.getpid()}"
            if args.citus_dsn:
                drop_toolkit_objects(args.citus_dsn)
                with psycopg.connect(args.citus_dsn, autocommit=True) as conn:
                    conn.execute("DROP TABLE IF EXISTS chaos_ledger")
                cluster = Server(args.citus_dsn)
                figures = anyio.run(chaos, config, cluster, args.citus_dsn, folder, args.shards)
                for node, tasks, tenants in tasks_per_node(args.citus_dsn):
                    note(f"chaos: node {node} holds {tasks} tasks of {tenants} tenants")
            else:
                with scratch(server_dsn, name, args.keep) as dsn:
                    figures = anyio.run(chaos, config, server, dsn, folder)
    finally:
        if home is not None and not args.keep:
            stop_embedded(home)
            shutil.rmtree(home, ignore_errors=True)
        elif home is not None:
            note(f"chaos: embedded server left running: toolkit --home {home} db stop")
    print(figures.line(), flush=True)
    return 0 if figures.ok else 1


@contextlib.contextmanager
def scratch(server_dsn: str, name: str, keep: bool) -> Iterator[str]:
    """The run's database: a scratch one, dropped at the end unless ``keep``."""
    if not keep:
        with scratch_database(server_dsn, name) as dsn:
            yield dsn
        return
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    note(f"chaos: database {name} kept")
    yield with_dbname(server_dsn, name)


if __name__ == "__main__":
    sys.exit(main())
