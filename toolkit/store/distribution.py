"""The distributed layout on Citus: ``toolkit db migrate --distribute`` (issue 25).

The same migrations run on one PostgreSQL and on a Citus coordinator; this applies the
distribution on top, once (``toolkit/store/sql/distribution.sql``): tasks and every table
that carries a tenant distributed by tenant and co-located, the small tables as reference
tables, what Citus refuses on a distributed table (triggers, foreign keys, keys without the
tenant) removed first. docs/scaling.md says what runs on the cluster and what does not yet.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from typing import Any

from psycopg import sql

from toolkit.errors import ConfigError, SchemaOutdated
from toolkit.store.database import Database
from toolkit.store.migrations import schema_status
from toolkit.store.queries import parse_named_blocks

#: The blocks that make the layout, in order, each in a transaction of its own.
_STEPS = ("prepare_layout", "distribute_by_tenant", "reference_tables", "distributed_functions")


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """How one toolkit table is laid out on the cluster.

    Attributes:
        table: its name.
        layout: ``by tenant``, ``reference`` or ``local`` (not distributed).
        shards: its shards per node (``host:port``).
    """

    table: str
    layout: str
    shards: dict[str, int]


def _statements() -> dict[str, str]:
    text = (importlib.resources.files("toolkit.store") / "sql" / "distribution.sql").read_text(
        encoding="utf-8"
    )
    return parse_named_blocks(text)


async def distribute(db: Database, *, shards: int | None = None) -> tuple[bool, list[TableLayout]]:
    """Distribute the toolkit's tables over the Citus cluster ``db`` is the coordinator of.

    Applied once: a store already distributed is left as it is.

    Args:
        db: the coordinator's database, migrated.
        shards: shards per distributed table (None: Citus' ``citus.shard_count``, 32 unless
            set). Every read across tenants (the claim's window, the idle check) visits each
            shard: a few per worker node is enough to spread the tenants, and the count
            bounds how many nodes they can ever spread over (docs/scaling.md).

    Returns:
        ``(applied, layout)``: whether this call distributed the tables, and each table's
        layout and shards per node.

    Raises:
        ConfigError: the database has no ``citus`` extension (it is one PostgreSQL, or
            Citus is not installed there: ``CREATE EXTENSION citus`` on every node).
        SchemaOutdated: migrations are pending (``toolkit db migrate`` first: the
            distribution is applied on top of the current schema).
        DatabaseUnavailable, StoreError: the database failed a step; the tables of the
            steps before it stay as they were made.
    """
    statements = _statements()
    if not await _fetch(db, statements["citus_version"]):
        raise ConfigError(
            "--distribute needs Citus: this database has no citus extension (install Citus "
            "on every node, CREATE EXTENSION citus, add the workers; docs/scaling.md)"
        )
    status = await schema_status(db)
    if status.pending:
        raise SchemaOutdated(
            f"the schema is at version {status.current}, this toolkit needs "
            f"{status.expected}: run `toolkit db migrate` first"
        )
    applied = not (await _fetch(db, statements["distributed"]))[0]["distributed"]
    if applied:
        async with db.connection() as conn:
            if shards is not None:
                await conn.execute(sql.SQL("SET citus.shard_count = {}").format(shards))
            for step in _STEPS:
                await conn.execute(statements[step])
            if shards is not None:
                await conn.execute("RESET citus.shard_count")
    rows = await _fetch(db, statements["distribution_report"])
    return applied, [TableLayout(r["table_name"], r["layout"], dict(r["shards"])) for r in rows]


async def is_distributed(db: Database) -> bool:
    """Whether the toolkit's tables in ``db`` are distributed by tenant (Citus).

    True after ``toolkit db migrate --distribute``: claims, heartbeats and group commits are
    then made tenant by tenant (``toolkit.store.distributed_leases``). Asked once per
    :class:`Database` (a store is distributed while no worker runs: docs/scaling.md).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    if db.distributed is None:
        statements = _statements()
        db.distributed = bool(await _fetch(db, statements["citus_version"])) and bool(
            (await _fetch(db, statements["distributed"]))[0]["distributed"]
        )
    return db.distributed


async def _fetch(db: Database, sql: str) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cursor = await conn.execute(sql)
        names = [c.name for c in cursor.description or ()]
        return [dict(zip(names, row, strict=True)) for row in await cursor.fetchall()]
