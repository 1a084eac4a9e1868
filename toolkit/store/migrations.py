"""Schema migrations: numbered plain-SQL files applied in order.

Each is applied in one transaction together with its version bump (STYLE.md, "SQL and
migrations"), statement by statement: Citus sends some DDL of a distributed table (an index
made or dropped, a table's storage parameters) to the worker nodes as the text it came in,
and refuses that text when it holds several statements (docs/scaling.md).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import re
from typing import LiteralString

import psycopg

from toolkit.errors import StoreError
from toolkit.store.database import Database, first_line, is_unavailable

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>\w+)\.sql$")

_CREATE_VERSION_TABLE: LiteralString = """
CREATE TABLE IF NOT EXISTS toolkit_schema_version (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""
# A fixed advisory lock key so that two processes migrating at once take turns.
_LOCK: LiteralString = "SELECT pg_advisory_xact_lock(7243015771)"
_APPLIED: LiteralString = "SELECT version FROM toolkit_schema_version ORDER BY version"
_RECORD: LiteralString = "INSERT INTO toolkit_schema_version (version, name) VALUES (%s, %s)"


@dataclasses.dataclass(frozen=True)
class Migration:
    """One numbered schema migration file."""

    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        """The file's statements, in order, each with the comments before it.

        ``sqlparse`` splits them (a dollar-quoted body stays whole); a piece that is only
        comments is left out.
        """
        import sqlparse  # here: 6 ms of imports that only a migration needs, not every start

        return [
            statement
            for statement in sqlparse.split(self.sql)
            if sqlparse.format(statement, strip_comments=True).strip()
        ]


@dataclasses.dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands against the migrations this package ships."""

    applied: tuple[int, ...]
    available: tuple[int, ...]

    @property
    def pending(self) -> tuple[int, ...]:
        """Versions shipped but not applied yet."""
        return tuple(v for v in self.available if v not in self.applied)

    @property
    def current(self) -> int:
        """The highest applied version (0 for an empty database)."""
        return max(self.applied, default=0)

    @property
    def expected(self) -> int:
        """The highest version this package ships."""
        return max(self.available, default=0)


def available_migrations() -> list[Migration]:
    """List the migrations shipped in ``toolkit/sql/migrations``, in version order."""
    folder = importlib.resources.files("toolkit.store") / "sql" / "migrations"
    migrations = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            migrations.append(
                Migration(
                    int(match.group("version")),
                    match.group("name"),
                    entry.read_text(encoding="utf-8"),
                )
            )
    return sorted(migrations, key=lambda m: m.version)


async def schema_status(db: Database) -> SchemaStatus:
    """Read which migrations a database has applied.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    async with db.connection() as conn:
        exists = await (
            await conn.execute("SELECT to_regclass('toolkit_schema_version') IS NOT NULL")
        ).fetchone()
        applied: tuple[int, ...] = ()
        if exists and exists[0]:
            applied = tuple(row[0] for row in await (await conn.execute(_APPLIED)).fetchall())
    return SchemaStatus(applied, tuple(m.version for m in available_migrations()))


async def migrate(db: Database) -> list[Migration]:
    """Apply every pending migration, each in its own transaction with its version row.

    Safe to run from several processes at once: an advisory lock makes them take turns and
    the second finds nothing to do.

    Returns:
        The migrations applied by this call (empty when the schema was current).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
        StoreError: a migration failed (its file named, with the database's reason, e.g. a
            lock it waited for past its ``lock_timeout``); it was rolled back, the ones
            before it stay applied and later ones were not tried: running this again tries
            it again.
    """
    applied: list[Migration] = []
    async with db.connection() as conn:
        async with conn.transaction():
            await conn.execute(_LOCK)
            await conn.execute(_CREATE_VERSION_TABLE)
        for migration in available_migrations():
            try:
                async with conn.transaction():
                    await conn.execute(_LOCK)
                    done = {row[0] for row in await (await conn.execute(_APPLIED)).fetchall()}
                    if migration.version in done:
                        continue
                    for statement in migration.statements():
                        await conn.execute(statement)  # SQL of a file shipped in the package
                    await conn.execute(_RECORD, (migration.version, migration.name))
            except psycopg.Error as exc:
                if is_unavailable(exc):
                    raise
                raise StoreError(
                    f"migration {migration.version:04d}_{migration.name} failed and was rolled"
                    f" back ({exc.sqlstate or 'no SQLSTATE'}: {first_line(exc)}); the ones"
                    " before it stay applied: run `toolkit db migrate` again"
                ) from exc
            applied.append(migration)
    return applied
