"""``toolkit db migrate --distribute``: the distributed layout on a Citus cluster (issue 25;
docs/scaling.md). On one PostgreSQL it is refused with a message; on the cluster of
``TOOLKIT_TEST_CITUS_DSN`` (skipped without one, tests/helpers/citus.py) the tables are
spread by tenant over the workers, and a task's own statements run there."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from tests.apps.counting import CREATE_CALLS
from tests.helpers.citus import CITUS_DSN, empty_cluster, needs_citus, shards_of_tenants
from tests.helpers.inprocess import drain, invoke
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.errors import CallbackRefused, ConfigError, UnknownTask
from toolkit.store import Store, migrations
from toolkit.store.distribution import TableLayout, distribute
from toolkit.store.writes import Event, EvidenceRecord, FencedWrite

pytestmark = pytest.mark.anyio

WAITER = """
name: citus-waiter
version: 1
start: wait
steps:
  wait: {wait: {signal: go}}
"""


@pytest.mark.one_postgresql
async def test_one_postgresql_is_not_distributed(store: Store) -> None:
    with pytest.raises(ConfigError, match="--distribute needs Citus: this database has no citus"):
        await distribute(store.db)


@pytest.mark.one_postgresql
def test_the_command_says_why_it_distributes_nothing(dsn: str) -> None:
    code, out, err = invoke(dsn, "db", "migrate", "--distribute")
    assert code == 1, (out, err)
    assert "schema is up to date" in out and err.count("\n") == 1, err
    assert "no citus extension" in err, err


@pytest.mark.one_postgresql
def test_shards_go_with_distribute(dsn: str) -> None:
    code, out, err = invoke(dsn, "db", "migrate", "--shards", "4")
    assert code == 2 and "--shards goes with --distribute" in err, (out, err)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Store, bool, list[TableLayout]]]:
    """A store on the emptied cluster, migrated and distributed."""
    assert CITUS_DSN is not None
    empty_cluster(CITUS_DSN)
    async with await Store.open(CITUS_DSN) as store:
        applied, layout = await distribute(store.db)
        yield store, applied, layout


@needs_citus
async def test_the_tables_are_spread_by_tenant_over_the_workers(
    cluster: tuple[Store, bool, list[TableLayout]],
) -> None:
    store, applied, layout = cluster
    assert applied
    by_table = {table.table: table for table in layout}
    by_tenant = {name for name, table in by_table.items() if table.layout == "by tenant"}
    assert {"toolkit_tasks", "toolkit_tenants", "toolkit_effect_evidence",
            "toolkit_task_events", "toolkit_signals", "toolkit_branches"} <= by_tenant  # fmt: skip
    for name in by_tenant:
        assert len(by_table[name].shards) >= 2, by_table[name]  # on two workers at least
    for name in ("toolkit_definitions", "toolkit_workers", "toolkit_limits", "toolkit_schedules"):
        assert by_table[name].layout == "reference", by_table[name]
    assert not [t for t in layout if t.layout == "local"], layout
    again, _ = await distribute(store.db)
    assert not again  # once


@needs_citus
async def test_a_tasks_own_statements_run_on_the_cluster(
    cluster: tuple[Store, bool, list[TableLayout]],
) -> None:
    """Submit, read, signal, cancel and redrive tasks of tenants on both workers."""
    store, _, _ = cluster
    assert CITUS_DSN is not None
    d = definition(WAITER)
    await store.definitions.deploy(d)
    tenants = [f"tenant-{i}" for i in range(8)]
    nodes = shards_of_tenants(CITUS_DSN, tenants)
    assert len(set(nodes.values())) >= 2, nodes  # the tasks live on both workers
    for tenant in tenants:
        (task_id,) = await store.tasks.submit(d, [{}], tenant=tenant)
        task = await store.tasks.get(task_id)
        assert (task.tenant, task.state) == (tenant, "queued"), task
        assert await store.tasks.signal(task_id, "go", {"n": 1}, tenant=tenant) > 0
        assert [s["name"] for s in await store.tasks.signals(task_id)] == ["go"]
        assert await store.tasks.cancel(task_id, "done with it") == "cancelled"
        await store.tasks.redrive(task_id, reason="again", tenant=tenant)
        task = await store.tasks.get(task_id, tenant=tenant)
        assert task.state == "queued", task
        kinds = [e["kind"] for e in await store.tasks.events(task_id, tenant=tenant)]
        assert kinds == ["submitted", "signal_received", "cancelled", "redriven"], kinds
    # A parent's cancel reaches its live child (a child made by hand: no worker runs here),
    # and an unknown id or callback token is reported as on one PostgreSQL (regression: the
    # cluster refused the statements that did not name a tenant).
    (parent, child) = await store.tasks.submit(d, [{}, {}], tenant="tenant-0")
    async with store.db.connection() as conn:
        await conn.execute(
            "UPDATE toolkit_tasks SET parent_id = %s, parent_occurrence = 'kid#1'"
            " WHERE id = %s AND tenant = 'tenant-0'",
            (parent, child),
        )
    assert await store.tasks.cancel(parent) == "cancelled"
    assert (await store.tasks.get(child)).state == "cancelled"
    with pytest.raises(UnknownTask, match=r"^no task 999999$"):
        await store.tasks.cancel(999999)
    with pytest.raises(CallbackRefused, match="no callback token"):
        await store.tasks.complete("cb_nosuch", result={})


@needs_citus
async def test_a_worker_runs_tenants_tasks_on_both_workers(
    cluster: tuple[Store, bool, list[TableLayout]],
) -> None:
    """Claims, heartbeats and group commits tenant by tenant, each statement on the tenant's
    node (toolkit/store/distributed_leases.py): a worker drains three-step tasks of eight
    tenants spread over both workers; each is claimed once, its evidence and events stored
    with it."""
    store, _, _ = cluster
    assert CITUS_DSN is not None
    async with store.db.connection() as conn:
        await conn.execute(CREATE_CALLS)
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    tenants = [f"tenant-{i}" for i in range(8)]
    assert len(set(shards_of_tenants(CITUS_DSN, tenants).values())) >= 2
    ids = {
        tenant: await store.tasks.submit(d, [{"n": n} for n in range(5)], tenant=tenant)
        for tenant in tenants
    }
    report = await drain(store, THREE_STEPS)
    assert store.db.distributed
    assert (report.succeeded, report.lease_lost, report.recovered) == (40, 0, 0), report
    for tenant, task_ids in ids.items():
        for n, task_id in enumerate(task_ids):
            task = await store.tasks.get(task_id, tenant=tenant)
            kinds = [e["kind"] for e in await store.tasks.events(task_id, tenant=tenant)]
            records = [
                (e["step"], e["record"])
                for e in await store.tasks.evidence(task_id, tenant=tenant)
            ]
            assert task.state == "succeeded", (task, kinds)
            assert kinds.count("claimed") == 1 and kinds[-1] == "succeeded", kinds
            # the non-idempotent step's evidence before its call; n = 0 routes past "third"
            steps = [("first", "completed"), ("second", "started"), ("second", "completed")]
            assert records == steps + ([] if n == 0 else [("third", "completed")]), records


@needs_citus
async def test_the_shards_per_table_are_chosen() -> None:
    """``--shards``: every read across tenants visits each shard, so a cluster of few nodes
    wants few (docs/scaling.md)."""
    assert CITUS_DSN is not None
    empty_cluster(CITUS_DSN)
    async with await Store.open(CITUS_DSN) as store:
        applied, layout = await distribute(store.db, shards=4)
    assert applied
    for table in layout:
        if table.layout == "by tenant":
            assert sum(table.shards.values()) == 4 and len(table.shards) == 2, table


@needs_citus
async def test_a_store_distributed_by_the_previous_release_migrates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: Citus sends some DDL of a distributed table (an index made or dropped,
    a table's storage parameters) to the worker nodes as the text it came in, and refused a
    migration file of several statements ("cannot insert multiple commands into a prepared
    statement"): a store distributed before migration 0036 could not be upgraded. The
    migrations now run statement by statement."""
    assert CITUS_DSN is not None
    empty_cluster(CITUS_DSN)
    every = migrations.available_migrations()
    monkeypatch.setattr(migrations, "available_migrations", lambda: every[:-1])
    async with await Store.open(CITUS_DSN) as store:
        await distribute(store.db, shards=4)
        monkeypatch.setattr(migrations, "available_migrations", lambda: every)
        applied = await migrations.migrate(store.db)
        status = await migrations.schema_status(store.db)
    assert [m.version for m in applied] == [every[-1].version]
    assert not status.pending


def _two_phase_commits(dsn: str) -> int:
    """Transactions the coordinator committed in two phases and Citus has not yet recovered."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_dist_transaction").fetchone()
    return int(row[0]) if row else 0


@contextlib.contextmanager
def _recovery_held_off(dsn: str) -> Iterator[None]:
    """Citus' recovery of two-phase commits off (they stay in pg_dist_transaction), those
    already there recovered first; on again after."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET citus.recover_2pc_interval = -1")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("SELECT recover_prepared_transactions()")
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET citus.recover_2pc_interval")
            conn.execute("SELECT pg_reload_conf()")


@needs_citus
async def test_a_claim_and_a_group_commit_commit_in_one_phase(
    cluster: tuple[Store, bool, list[TableLayout]],
) -> None:
    """Regression (issue 25, the chaos run's stalled leases): a claim's events and a group
    commit's evidence and events went in by INSERT ... SELECT, which Citus runs on the
    coordinator and copies to the shard, and then commits the transaction in two phases; a
    backend killed between the phases left prepared transactions holding the tasks' rows
    until Citus recovered them (a minute by default). They are INSERTs of values now, routed
    to the tenant's shard: no two-phase commit. Counted in pg_dist_transaction; the control
    at the end shows the count moves for a copy."""
    store, _, _ = cluster
    assert CITUS_DSN is not None
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    tenants = ["tenant-0", "tenant-1", "tenant-2", "tenant-3"]
    assert len(set(shards_of_tenants(CITUS_DSN, tenants).values())) == 2  # both nodes
    for tenant in tenants:
        await store.tasks.submit(d, [{"n": 1}], tenant=tenant)
    with _recovery_held_off(CITUS_DSN):
        assert _two_phase_commits(CITUS_DSN) == 0
        claimed = await store.leases.claim("w", [d.digest], 4, 30.0)
        assert sorted(task.tenant for task in claimed) == tenants
        writes = [
            FencedWrite(
                task.fence("w"), {**task.checkpoint, "cursor": "second"},
                evidence=(EvidenceRecord(
                    occurrence="first#1", step="first", handler="count.work", idempotent=True,
                    idempotency_key=f"{task.id}:first#1", record="completed", attempt=1,
                    result={"v": 1},
                ),),
                events=(Event("progress", {"step": "first"}),),
            )
            for task in claimed
        ]  # fmt: skip
        applied = await store.leases.commit_many(writes)
        assert set(applied.values()) == {"leased"}, applied
        assert _two_phase_commits(CITUS_DSN) == 0
        task = claimed[0]
        kinds = [e["kind"] for e in await store.tasks.events(task.id, tenant=task.tenant)]
        assert kinds == ["submitted", "claimed", "progress"], kinds
        assert [e["record"] for e in await store.tasks.evidence(task.id)] == ["completed"]
        # The control: an INSERT ... SELECT in a transaction that changed a task.
        async with store.db.transaction() as conn:
            await conn.execute(
                "UPDATE toolkit_tasks SET updated_at = now() WHERE id = %s AND tenant = %s",
                (task.id, task.tenant),
            )
            await conn.execute(
                "INSERT INTO toolkit_task_events (task_id, tenant, kind)"
                " SELECT %s, %s, 'probe' FROM generate_series(1, 1)",
                (task.id, task.tenant),
            )
        assert _two_phase_commits(CITUS_DSN) > 0
