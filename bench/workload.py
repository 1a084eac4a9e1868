"""What the engine and the floor share: the workload, scratch databases, seeding, metrics.

Every measurement runs in a database of its own, created on the server, migrated with the
toolkit's own migrations, seeded through the store API and dropped afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import LiteralString, Protocol

import anyio
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.noop_app import NOOP_HANDLER
from toolkit.definition import WorkflowDefinition, parse_definition
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.embedded import start_embedded, stop_embedded
from toolkit.store.migrations import migrate

#: Inputs per ``store.tasks.submit`` call.
SUBMIT_CHUNK = 1000
#: The tables a finished task leaves rows in.
TASK_TABLES = ("toolkit_tasks", "toolkit_effect_evidence", "toolkit_task_events")


@dataclasses.dataclass(frozen=True)
class Workload:
    """One definition: a chain of ``steps`` no-op effects, all idempotent or none."""

    steps: int
    idempotent: bool

    @property
    def name(self) -> str:
        return f"bench-noop-{self.steps}-{'idem' if self.idempotent else 'nonidem'}"

    def step_ids(self) -> list[str]:
        return [f"s{index}" for index in range(1, self.steps + 1)]

    def yaml(self) -> str:
        """The definition; the last effect has no ``next``, so its output is the result."""
        ids = self.step_ids()
        flag = "true" if self.idempotent else "false"
        lines = [f"name: {self.name}", "version: 1", "input: {type: object}", f"start: {ids[0]}"]
        lines.append("steps:")
        for step, following in zip(ids, [*ids[1:], None], strict=True):
            tail = "" if following is None else f", next: {following}"
            lines.append(f"  {step}: {{effect: {NOOP_HANDLER}, idempotent: {flag}{tail}}}")
        return "\n".join(lines) + "\n"

    def definition(self) -> WorkflowDefinition:
        return parse_definition(self.yaml(), source=f"<{self.name}>")


@dataclasses.dataclass(frozen=True)
class TimerWorkload:
    """One definition: a durable timer wait of ``duration``, then one no-op effect.

    Its tasks park in ``waiting`` (reason ``timer``, ``run_at`` = park time + duration) after
    their first cycle: the background load of "waiting timers cost nothing".
    """

    duration: str = "1h"

    @property
    def name(self) -> str:
        return "bench-timer"

    def yaml(self) -> str:
        return "\n".join([
            f"name: {self.name}", "version: 1", "input: {type: object}", "start: pause",
            "steps:",
            f"  pause: {{wait: {{duration: {self.duration}}}, next: done}}",
            f"  done: {{effect: {NOOP_HANDLER}, idempotent: true}}",
        ]) + "\n"  # fmt: skip

    def definition(self) -> WorkflowDefinition:
        return parse_definition(self.yaml(), source=f"<{self.name}>")


TIMER = TimerWorkload()


class Deployable(Protocol):
    """A benchmark definition: its name, YAML text and parsed form."""

    @property
    def name(self) -> str: ...

    def yaml(self) -> str: ...

    def definition(self) -> WorkflowDefinition: ...


def write_definitions(folder: Path, workloads: Iterable[Deployable]) -> Path:
    """Write one YAML file per workload into ``folder`` (a worker's ``--definitions``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for workload in workloads:
        (folder / f"{workload.name}.yaml").write_text(workload.yaml(), encoding="utf-8")
    return folder


@dataclasses.dataclass(frozen=True)
class Percentiles:
    """A latency distribution, milliseconds (linear interpolation, like ``percentile_cont``)."""

    count: int
    p50: float
    p99: float
    max: float

    def __str__(self) -> str:
        return f"{self.p50:.1f} / {self.p99:.1f}"


def percentiles(values_ms: Sequence[float]) -> Percentiles:
    """p50, p99 and max of ``values_ms`` (at least two values)."""
    cuts = statistics.quantiles(values_ms, n=100, method="inclusive")
    return Percentiles(len(values_ms), cuts[49], cuts[98], max(values_ms))


#: Per task of one definition, the database time from its first ``first`` event to its
#: first ``last`` event.
_EVENT_GAPS: LiteralString = """
SELECT extract(epoch FROM b - a)::float8 * 1000
FROM (SELECT e.task_id, min(e.at) FILTER (WHERE e.kind = %(first)s) AS a,
             min(e.at) FILTER (WHERE e.kind = %(last)s) AS b
      FROM toolkit_task_events e
      JOIN toolkit_tasks t ON t.id = e.task_id AND t.definition_name = %(definition)s
      WHERE e.kind IN (%(first)s, %(last)s)
      GROUP BY e.task_id) gaps
WHERE a IS NOT NULL AND b IS NOT NULL
"""


def event_latency(dsn: str, definition: str, first: str, last: str) -> Percentiles:
    """Latency between two task events (``toolkit_task_events.at``: database time), over the
    tasks of ``definition`` that have both, e.g. ``submitted`` → ``claimed``."""
    params = {"definition": definition, "first": first, "last": last}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(_EVENT_GAPS, params).fetchall()
    return percentiles([float(ms) for (ms,) in rows])


@dataclasses.dataclass(frozen=True)
class Counters:
    """Cumulative activity of one database (``pg_stat_database``)."""

    commits: int
    inserted: int
    updated: int

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.commits - other.commits,
            self.inserted - other.inserted,
            self.updated - other.updated,
        )


def with_dbname(dsn: str, dbname: str) -> str:
    """The DSN of another database on the same server."""
    return make_conninfo(dsn, dbname=dbname)


@contextlib.contextmanager
def bench_server(dsn: str | None, home: str | None = None) -> Iterator[str]:
    """Yield a server DSN: ``dsn`` itself, or an embedded server stopped again at the end.

    Args:
        dsn: a server to use as is; None starts the embedded server.
        home: the embedded server's home (kept running afterwards); None uses a temporary
            folder and stops the server at the end.
    """
    if dsn is not None:
        yield dsn
    elif home is not None:
        yield _start_embedded(home)
    else:
        with tempfile.TemporaryDirectory(prefix="runifold-bench-") as temp:
            try:
                yield _start_embedded(temp)
            finally:
                stop_embedded(temp)


def _start_embedded(home: str) -> str:
    with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import
        warnings.simplefilter("ignore")
        return start_embedded(home)


def _admin(server_dsn: str, statement: sql.Composed) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(statement)


@contextlib.contextmanager
def scratch_database(server_dsn: str, name: str) -> Iterator[str]:
    """Create database ``name`` (dropping a leftover), yield its DSN, drop it at the end."""
    ident = sql.Identifier(name)
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident)
    _admin(server_dsn, drop)
    _admin(server_dsn, sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        yield with_dbname(server_dsn, name)
    finally:
        _admin(server_dsn, drop)


def seed(dsn: str, workload: Deployable, tasks: int) -> None:
    """Migrate the database, deploy the workload's definition, queue ``tasks`` tasks, then
    ANALYZE and CHECKPOINT (when allowed) so every run starts from the same state."""
    anyio.run(_seed, dsn, workload, tasks)


async def _seed(dsn: str, workload: Deployable, tasks: int) -> None:
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        store = Store(db)
        definition = workload.definition()
        await store.definitions.deploy(definition)
        inputs = [{"i": index} for index in range(tasks)]
        for start in range(0, tasks, SUBMIT_CHUNK):
            await store.tasks.submit(definition, inputs[start : start + SUBMIT_CHUNK])
        async with db.connection() as conn:
            await conn.execute("ANALYZE")
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                await conn.execute("CHECKPOINT")  # the run does not pay for the seeding's I/O
    finally:
        await db.close()


def _fetch(dsn: str, statement: LiteralString) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


def task_states(dsn: str) -> dict[str, int]:
    """Number of tasks in each state."""
    rows = _fetch(dsn, "SELECT state, count(*) FROM toolkit_tasks GROUP BY state")
    return {str(state): int(str(count)) for state, count in rows}


def vacuum_analyze(dsn: str) -> None:
    """``VACUUM (ANALYZE)`` the task tables: what autovacuum would have done by now."""
    tables = sql.SQL(", ").join(map(sql.Identifier, TASK_TABLES))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(tables))


def wait_for_states(dsn: str, expected: dict[str, int], *, timeout: float) -> None:
    """Poll :func:`task_states` until it equals ``expected``.

    Raises:
        TimeoutError: not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while (states := task_states(dsn)) != expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"expected task states {expected}, found {states}")
        time.sleep(0.05)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def server_cpu(dsn: str) -> float | None:
    """CPU seconds used so far by the server's process tree (Linux, same machine only).

    The postmaster's own and reaped children's time (``cutime``, ``cstime``: backends that
    have exited) plus the time of its live children (backends, WAL writer, checkpointer...):
    the difference of two reads is the server's CPU in between, whichever database used it.
    None when the server is not a local process this user can read.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        postmaster = _stat(conn.info.backend_pid)
    if postmaster is None:
        return None
    root = int(postmaster[1])  # field 4, ppid: the postmaster
    fields = _stat(root)
    if fields is None:
        return None
    ticks = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        child = _stat(int(entry.name)) if entry.name.isdigit() else None
        if child is not None and int(child[1]) == root:
            ticks += int(child[11]) + int(child[12])
    return ticks / _CLOCK_TICKS


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from field 3 (state) on, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def counters(dsn: str, *, settle: float = 0.2, timeout: float = 5.0) -> Counters:
    """The database's counters once they stop moving.

    Backends report their statistics when they exit, a moment after their client closed
    the connection; this waits until two reads ``settle`` seconds apart agree (give or take
    the reading connections' own transactions).
    """
    statement: LiteralString = (
        "SELECT xact_commit, tup_inserted, tup_updated FROM pg_stat_database "
        "WHERE datname = current_database()"
    )
    deadline = time.monotonic() + timeout
    previous: Counters | None = None
    while True:
        (row,) = _fetch(dsn, statement)
        current = Counters(*(int(str(value)) for value in row))
        if previous is not None and (
            current.commits - previous.commits <= 2 or time.monotonic() > deadline
        ):
            return current
        previous = current
        time.sleep(settle)


def stored_bytes(dsn: str, *, compact: bool = False) -> dict[str, int]:
    """Bytes of each task table with its indexes and TOAST; ``compact`` first runs
    ``VACUUM FULL`` so that only live rows count."""
    tables = sql.SQL(", ").join(map(sql.Identifier, TASK_TABLES))
    with psycopg.connect(dsn, autocommit=True) as conn:
        if compact:
            conn.execute(sql.SQL("VACUUM FULL {}").format(tables))
        rows = conn.execute(
            "SELECT t, pg_total_relation_size(t::regclass) FROM unnest(%s::text[]) t",
            (list(TASK_TABLES),),
        ).fetchall()
    return {str(table): int(size) for table, size in rows}
