"""What the engine and the floor share: the workload, scratch databases, seeding, metrics.

Every measurement runs in a database of its own, created on the server, migrated with the
toolkit's own migrations, seeded through the store API and dropped afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import LiteralString

import anyio
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.noop_app import NOOP_HANDLER
from toolkit.database import Database
from toolkit.definition import WorkflowDefinition, parse_definition
from toolkit.embedded import start_embedded, stop_embedded
from toolkit.migrations import migrate
from toolkit.store import Store

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


def seed(dsn: str, workload: Workload, tasks: int) -> None:
    """Migrate the database, deploy the workload's definition, queue ``tasks`` tasks, then
    ANALYZE and CHECKPOINT (when allowed) so every run starts from the same state."""
    anyio.run(_seed, dsn, workload, tasks)


async def _seed(dsn: str, workload: Workload, tasks: int) -> None:
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
