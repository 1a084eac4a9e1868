"""Migration 0026 on a store in use: rows written before it get their task's tenant, the
tasks in flight run on, and the previous release's workers may still insert rows
(docs/decisions.md, "Past one primary (issue 25, first step)")."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.apps.counting import CREATE_CALLS, app
from tests.conftest import at_schema_version
from tests.helpers.tenants import PER_TASK_TABLES, rows_under_another_tenant
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.checkpoint import Checkpoint
from toolkit.history.audit import audit_all
from toolkit.runtime.config import SupervisorConfig
from toolkit.runtime.supervisor import WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def test_rows_written_before_the_upgrade_get_their_tasks_tenant(empty_dsn: str) -> None:
    d = definition(THREE_STEPS)
    at_schema_version(empty_dsn, 25)
    checkpoint = Jsonb(Checkpoint.initial(d.start).to_json())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(CREATE_CALLS)  # the counting app's table of calls
        conn.execute("INSERT INTO toolkit_tenants (tenant) VALUES ('acme'), ('globex')")
        ids = [
            row[0]
            for row in conn.execute(
                "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
                " definition_digest, input, checkpoint)"
                " VALUES ('acme', %s, %s, %s, '{\"n\": 2}', %s),"
                " ('globex', %s, %s, %s, '{\"n\": 3}', %s) RETURNING id",
                (d.name, d.version, d.digest, checkpoint) * 2,
            ).fetchall()
        ]
        for task_id in ids:
            conn.execute(
                "INSERT INTO toolkit_task_events (task_id, kind) VALUES (%s, 'submitted')",
                (task_id,),
            )
            conn.execute(
                "INSERT INTO toolkit_signals (task_id, name, payload) VALUES (%s, 'nudge', '{}')",
                (task_id,),
            )
    async with await Store.open(empty_dsn) as store:  # migrates
        stored = await _tenants(store, "toolkit_task_events") + await _tenants(
            store, "toolkit_signals"
        )
        assert sorted(stored) == sorted([(ids[0], "acme"), (ids[1], "globex")] * 2), stored
        await store.definitions.deploy(d)
        worker = Worker(store, app, [d])
        config = SupervisorConfig(until_idle=True, lease=6.0, heartbeat=0.5)
        report = await WorkflowSupervisor(worker, config).run()
        assert report.succeeded == 2, report
        assert await rows_under_another_tenant(store) == []
        audit = await audit_all(store)
        assert audit.ok, audit.violations
        # A worker of the previous release, still running while the store is migrated (the
        # runbook's order), inserts without naming the column: accepted (regression: a
        # helper's report of old workers failing their writes on NOT NULL).
        async with store.db.connection() as conn:
            await conn.execute(
                "INSERT INTO toolkit_task_events (task_id, kind) VALUES (%s, 'note')", (ids[0],)
            )
        for table in PER_TASK_TABLES:
            if table != "toolkit_event_subscriptions":  # keyed by tenant since migration 0014
                assert await _nullable(store, table) == "YES", f"{table}.tenant"


async def _tenants(store: Store, table: str) -> list[tuple[int, str]]:
    async with store.db.connection() as conn:
        cursor = await conn.execute(f"SELECT task_id, tenant FROM {table}")  # type: ignore[arg-type]
        return [(row[0], row[1]) for row in await cursor.fetchall()]


async def _nullable(store: Store, table: str) -> str:
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT is_nullable FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = 'tenant'",
            (table,),
        )
        row = await cursor.fetchone()
    assert row is not None, f"{table} has no tenant column"
    return str(row[0])
