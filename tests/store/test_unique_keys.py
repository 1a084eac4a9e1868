"""The unique keys that inserts name include the tenant (migration 0032; issue 25, docs/scaling.md
"What remains", item 1): Citus keeps a unique index on a table distributed by tenant only
when it includes the tenant, and takes an ``ON CONFLICT`` target only when it names one."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.conftest import at_schema_version
from tests.helpers.tenants import PER_TASK_TABLES
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.checkpoint import Checkpoint
from toolkit.store import Store
from toolkit.store.queries import query, query_names

pytestmark = pytest.mark.anyio

#: The tables that are distributed by tenant on Citus (docs/scaling.md): every table with a
#: tenant column but the schedules, a reference table.
DISTRIBUTED_BY_TENANT = frozenset(PER_TASK_TABLES) | {
    "toolkit_tasks",
    "toolkit_tenants",
    "toolkit_tenant_budgets",
    "toolkit_throttle_keys",
    "toolkit_key_wakes",
    "toolkit_events",
}

# An insert and its ON CONFLICT clause, if any, before the statement's next insert.
_INSERT = re.compile(
    r"INSERT INTO (\w+)((?:(?!INSERT INTO).)*?)ON CONFLICT\s*(\(([^)]*)\))?", re.DOTALL
)


def _conflict_targets() -> list[tuple[str, str, list[str]]]:
    """(query, table, target columns) of every ON CONFLICT with a target, in every query."""
    found = []
    for name in query_names():
        for match in _INSERT.finditer(query(name)):
            if match.group(4) is not None:
                columns = [c.strip() for c in match.group(4).split(",")]
                found.append((name, match.group(1), columns))
    return found


def test_every_conflict_target_on_a_table_distributed_by_tenant_names_the_tenant() -> None:
    targets = _conflict_targets()
    assert len(targets) >= 10, targets  # the scan finds them
    missing = [
        (name, table, columns)
        for name, table, columns in targets
        if table in DISTRIBUTED_BY_TENANT and "tenant" not in columns
    ]
    assert missing == [], missing


def test_the_scan_finds_a_target_without_the_tenant() -> None:
    sql = (
        "WITH a AS (INSERT INTO toolkit_tenants (tenant) VALUES ('x') RETURNING tenant)"
        " INSERT INTO toolkit_branches (task_id) SELECT 1 ON CONFLICT (task_id, name) DO NOTHING"
    )
    matches = [(m.group(1), m.group(4)) for m in _INSERT.finditer(sql)]
    assert matches == [("toolkit_branches", "task_id, name")], matches


async def test_each_target_is_a_unique_index_of_the_schema(store: Store) -> None:
    """Each target names the columns of one unique index, in the index's order."""
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT t.relname, array_agg(a.attname ORDER BY k.ord)"
            " FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid"
            " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)"
            " JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum"
            " WHERE i.indisunique AND t.relname LIKE 'toolkit%%'"
            " GROUP BY t.relname, i.indexrelid"
        )
        unique = {(table, tuple(columns)) for table, columns in await cursor.fetchall()}
    for name, table, columns in _conflict_targets():
        assert (table, tuple(columns)) in unique, (name, table, columns, sorted(unique))


async def test_rows_without_their_tenant_get_it_and_the_old_targets_still_work(
    empty_dsn: str,
) -> None:
    """A signal a release before 0026 stored without its tenant gets it from the migration,
    and an insert of the previous release, naming the older key, still runs."""
    d = definition(THREE_STEPS)
    at_schema_version(empty_dsn, 31)
    checkpoint = Jsonb(Checkpoint.initial(d.start).to_json())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO toolkit_tenants (tenant) VALUES ('acme')")
        row = conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint) VALUES ('acme', %s, %s, %s, '{}', %s)"
            " RETURNING id",
            (d.name, d.version, d.digest, checkpoint),
        ).fetchone()
        assert row is not None
        task_id = row[0]
        conn.execute(
            "INSERT INTO toolkit_signals (task_id, name, payload, event_id)"
            " VALUES (%s, 'nudge', '{}', 7)",
            (task_id,),
        )
    async with await Store.open(empty_dsn) as store:  # migrates
        async with store.db.connection() as conn:
            cursor = await conn.execute("SELECT tenant FROM toolkit_signals")
            assert await cursor.fetchall() == [("acme",)]
            # The previous release's delivery of the same event, by the older target.
            cursor = await conn.execute(
                "INSERT INTO toolkit_signals (task_id, tenant, name, payload, event_id)"
                " VALUES (%s, 'acme', 'nudge', '{}', 7)"
                " ON CONFLICT (task_id, event_id) WHERE event_id IS NOT NULL DO NOTHING"
                " RETURNING id",
                (task_id,),
            )
            assert await cursor.fetchall() == []
            # This release's, by the new one.
            cursor = await conn.execute(
                "INSERT INTO toolkit_signals (task_id, tenant, name, payload, event_id)"
                " VALUES (%s, 'acme', 'nudge', '{}', 7)"
                " ON CONFLICT (task_id, event_id, tenant) WHERE event_id IS NOT NULL DO NOTHING"
                " RETURNING id",
                (task_id,),
            )
            assert await cursor.fetchall() == []
