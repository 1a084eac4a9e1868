"""Plan-regression guard of the claim path: the claim must go through its index.

A realistic mix of tasks (mostly terminal history, a few live ones) is inserted in its final
states, the table is vacuumed and analyzed (``enable_seqscan`` stays on), and the plans are
read with ``EXPLAIN (FORMAT JSON)``: the custom plan (parameters bound, as on a statement's
first executions) and the generic plan (``plan_cache_mode = force_generic_plan``: what a
worker connection may run once psycopg has prepared the statement and PostgreSQL has
settled on a generic plan). Nothing is executed.

The idle path is guarded too: a claim that finds nothing due and the idle worker's
``idle_state`` read index ranges, never every waiting timer.

The claim is fair across tenants (docs/tenants.md): per tenant, a lateral subquery reads that
tenant's due tasks off ``toolkit_tasks_tenant_due`` in due order. The plans are read with the
tasks spread over a few tenants, one of them limited (``max_active``) and locked by the claim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.checkpoint import Checkpoint
from toolkit.definition import WorkflowDefinition
from toolkit.errors import StoreError
from toolkit.store import Store, rotation
from toolkit.store.queries import query

#: One PostgreSQL's plans: a coordinator's EXPLAIN shows the distributed plan instead.
pytestmark = [pytest.mark.anyio, pytest.mark.one_postgresql]

TERMINAL, QUEUED, LEASED, WAITING = 5_000, 200, 50, 100
#: Tenants besides the four of the mix (issue 20: the claim reads only those it picks).
OTHER_TENANTS = 6_000
#: The types of the claim's named parameters (a prepared statement needs them).
CLAIM_TYPES = {
    "worker_id": "text",
    "digests": "text[]",
    "limit": "bigint",
    "lease_seconds": "float8",
    "deferring": "boolean",
    "locked": "text[]",
    "window": "bigint",
    "per_tenant": "bigint",
    "tenant": "text",
}

_INSERT = """
INSERT INTO toolkit_tasks
    (definition_name, definition_version, definition_digest, input, checkpoint, state,
     wait_reason, run_at, lease_owner, lease_token, lease_expires_at, attempts, result, error,
     finished_at, tenant)
SELECT %(name)s, %(version)s, %(digest)s, jsonb_build_object('n', i), %(checkpoint)s, state,
       CASE WHEN state = 'waiting' THEN 'timer' END,
       CASE state
           WHEN 'waiting' THEN now() + interval '1 hour' + i * interval '1 second'
           WHEN 'queued' THEN now() - i * interval '10 milliseconds'
           ELSE now() - interval '1 day' + i * interval '10 milliseconds' END,
       CASE WHEN state = 'leased' THEN 'other-worker' END,
       CASE WHEN state = 'queued' THEN 0 ELSE 1 END,
       CASE WHEN state = 'leased' THEN now() + interval '30 seconds' END,
       CASE WHEN state = 'queued' THEN 0 ELSE 1 END,
       CASE WHEN state = 'succeeded' THEN '{}'::jsonb END,
       CASE WHEN state IN ('failed', 'cancelled')
            THEN jsonb_build_object('name', 'Boom', 'message', 'failed') END,
       CASE WHEN state IN ('succeeded', 'failed', 'cancelled')
            THEN now() - interval '1 day' + i * interval '10 milliseconds' END,
       (ARRAY['default', 'acme', 'globex', 'limited'])[1 + i %% 4]
FROM (SELECT i, CASE WHEN i %% 10 = 0 THEN 'failed' WHEN i %% 10 = 1 THEN 'cancelled'
                     ELSE 'succeeded' END AS state
      FROM generate_series(1, %(terminal)s) i
      UNION ALL SELECT i, 'queued' FROM generate_series(1, %(queued)s) i
      UNION ALL SELECT i, 'leased' FROM generate_series(1, %(leased)s) i
      UNION ALL SELECT i, 'waiting' FROM generate_series(1, %(waiting)s) i) mix
ORDER BY mix.state = 'succeeded' DESC, i
"""


async def _mixed(store: Store) -> WorkflowDefinition:
    """Deploy a definition and insert the mix of tasks, then VACUUM (ANALYZE) the table, so
    autovacuum has nothing left to change under the plans."""
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    params = {
        "name": d.name, "version": d.version, "digest": d.digest,
        "checkpoint": json.dumps(Checkpoint.initial(d.start).to_json()),
        "terminal": TERMINAL, "queued": QUEUED, "leased": LEASED, "waiting": WAITING,
    }  # fmt: skip
    async with store.db.connection() as conn:
        await conn.execute(_INSERT, params)
        # Tasks inserted by hand: register their tenants as a submit would.
        await conn.execute(
            "INSERT INTO toolkit_tenants (tenant, max_active) SELECT DISTINCT tenant,"
            " CASE WHEN tenant = 'limited' THEN 5 END FROM toolkit_tasks"
        )
        # Many more tenants, none of them read by a claim: ready ones beyond its window, and
        # parked ones (not ready, due later or never).
        await conn.execute(
            "INSERT INTO toolkit_tenants (tenant, ready, vtime, next_due)"
            " SELECT format('other-%%s', i), i %% 3 = 0, 1000 + i,"
            " CASE WHEN i %% 3 = 1 THEN now() + interval '1 hour' END"
            " FROM generate_series(1, %(tenants)s) i",
            {"tenants": OTHER_TENANTS},
        )
        await conn.execute("VACUUM (ANALYZE) toolkit_tasks")
        await conn.execute("VACUUM (ANALYZE) toolkit_tenants")
        cursor = await conn.execute("SELECT state, count(*) FROM toolkit_tasks GROUP BY state")
        states = dict(await cursor.fetchall())
    assert states == {
        "succeeded": 4_000, "failed": 500, "cancelled": 500,
        "queued": QUEUED, "leased": LEASED, "waiting": WAITING,
    }  # fmt: skip
    return d


def _claim_params(d: WorkflowDefinition) -> dict[str, Any]:
    return {
        "worker_id": "w", "digests": [d.digest], "limit": 16, "lease_seconds": 30.0,
        "deferring": False, "locked": ["limited"], "window": 32, "per_tenant": 16,
        "tenant": None,
    }  # fmt: skip


async def _custom_plan(store: Store, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``EXPLAIN (FORMAT JSON)`` of a named query with its parameters bound."""
    async with store.db.connection() as conn:
        cursor = await conn.execute(f"EXPLAIN (FORMAT JSON) {query(name)}", params)
        row = await cursor.fetchone()
    assert row is not None
    return _root(row[0])


async def _generic_plan(
    store: Store, name: str, types: dict[str, str], values: dict[str, Any],
    *, analyze: bool = False,
) -> dict[str, Any]:
    """A named query's generic plan: prepared with ``$n`` parameters of ``types`` (by name),
    explained with ``values`` under ``plan_cache_mode = force_generic_plan``; with
    ``analyze``, run too (``EXPLAIN ANALYZE``, its rows counted) and rolled back."""  # fmt: skip
    names: list[str] = []

    def positional(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    text = re.sub(r"%\((\w+)\)s", positional, query(name))
    declared = ", ".join(types[each] for each in names)
    execute = sql.SQL("EXPLAIN ({}FORMAT JSON) EXECUTE plan_probe({})").format(
        sql.SQL("ANALYZE, " if analyze else ""),
        sql.SQL(", ").join(sql.Literal(values[each]) for each in names),
    )
    async with store.db.connection() as conn, conn.transaction(force_rollback=analyze):
        await conn.execute(f"PREPARE plan_probe({declared}) AS {text}")
        try:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            cursor = await conn.execute(execute)
            row = await cursor.fetchone()
        finally:
            await conn.execute("RESET plan_cache_mode")
            await conn.execute("DEALLOCATE plan_probe")
    assert row is not None
    return _root(row[0])


def _root(explained: Any) -> dict[str, Any]:
    document = json.loads(explained) if isinstance(explained, str) else explained
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _index(node: dict[str, Any]) -> str | None:
    """The index a scan reads (a bitmap heap scan's: that of its bitmap index scan)."""
    if node["Node Type"] == "Bitmap Heap Scan":
        (child,) = [c for c in node["Plans"] if c["Node Type"].startswith("Bitmap")]
        return _index(child)
    name: str | None = node.get("Index Name")
    return name


def _task_scans(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """``(node type, index)`` of every scan of toolkit_tasks."""
    return [
        (node["Node Type"], _index(node))
        for node in _nodes(plan)
        if node.get("Relation Name") == "toolkit_tasks" and "Scan" in node["Node Type"]
    ]


def _per_tenant(plan: dict[str, Any]) -> dict[str, Any]:
    """The per-tenant read of due tasks: the lateral ``Limit`` of the ``due`` CTE."""
    (cte,) = [node for node in _nodes(plan) if node.get("Subplan Name") == "CTE due"]
    (limit,) = [
        node for node in _nodes(cte)
        if node["Node Type"] == "Limit" and _task_scans(node)
    ]  # fmt: skip
    return limit


def _tenant_scans(plan: dict[str, Any]) -> set[tuple[str, str | None, float]]:
    """``(node type, index, rows read at most)`` of every scan of toolkit_tenants; a scan
    under a ``Limit`` reads at most that limit's rows."""
    found: set[tuple[str, str | None, float]] = set()

    def walk(node: dict[str, Any], bound: float) -> None:
        if node["Node Type"] == "Limit":
            bound = min(bound, node["Plan Rows"])
        if node.get("Relation Name") == "toolkit_tenants" and "Scan" in node["Node Type"]:
            found.add((node["Node Type"], _index(node), bound))
        for child in node.get("Plans", ()):
            walk(child, bound)

    walk(plan, float("inf"))
    return found


def _assert_claims_through_the_index(plan: dict[str, Any]) -> None:
    # No scan of the whole table anywhere: not for the due tasks, nor to count the leases
    # of a limited tenant or of the tenants in the batch (those read one tenant's leases).
    scans = _task_scans(plan)
    assert ("Seq Scan", None) not in scans
    assert set(scans) <= {
        ("Index Scan", "toolkit_tasks_tenant_due"),  # due tasks, per tenant
        ("Index Only Scan", "toolkit_tasks_tenant_leased"),  # leases, per tenant
        ("Index Scan", "toolkit_tasks_tenant_leased"),
        ("Index Scan", "toolkit_tasks_pkey"),  # the lock and update of the chosen tasks
    }, scans
    for node in _nodes(plan):
        if node.get("Index Name") == "toolkit_tasks_tenant_leased":
            assert "tenant" in node["Index Cond"] and "lease_expires_at" in node["Index Cond"]
    # Each tenant's due tasks are read in due order straight off the claim index (a Limit
    # over an ordered Index Scan): no bitmap scan, no sort of the live tasks.
    per_tenant = _per_tenant(plan)
    assert _task_scans(per_tenant) == [("Index Scan", "toolkit_tasks_tenant_due")]
    assert not [node for node in _nodes(per_tenant) if node["Node Type"] == "Sort"]
    # The per-tenant read is driven by the tenants (a nested loop with the tenant as key).
    (scan,) = [n for n in _nodes(per_tenant) if n.get("Relation Name") == "toolkit_tasks"]
    assert "tenant" in scan["Index Cond"]
    # The tenants: only the window (the rotation index), those due for promotion and the
    # limited ones, each an index range; a whole scan only to find two unpaused tenants.
    for node_type, index, bound in _tenant_scans(plan):
        assert index in {
            "toolkit_tenants_rotation", "toolkit_tenants_next_due", "toolkit_tenants_limited",
            "toolkit_tenants_pkey",
        } or (node_type == "Seq Scan" and bound <= 2), (node_type, index, bound)
    # The chosen tasks are locked by id, last.
    (cte,) = [node for node in _nodes(plan) if node.get("Subplan Name") == "CTE candidates"]
    (locking,) = [node for node in _nodes(cte) if node["Node Type"] == "LockRows"]
    locked_by = set(_task_scans(locking)) - {("Index Scan", "toolkit_tasks_tenant_due")}
    assert locked_by == {("Index Scan", "toolkit_tasks_pkey")}, locked_by


async def test_claim_uses_the_claim_index(store: Store) -> None:
    d = await _mixed(store)
    _assert_claims_through_the_index(await _custom_plan(store, "claim_tasks", _claim_params(d)))


async def test_prepared_claim_uses_the_claim_index_with_a_generic_plan(store: Store) -> None:
    d = await _mixed(store)
    plan = await _generic_plan(store, "claim_tasks", CLAIM_TYPES, _claim_params(d))
    _assert_claims_through_the_index(plan)


@pytest.mark.parametrize("plan_kind", ["custom", "generic"])
async def test_the_one_tenant_claim_reads_a_range_of_its_claim_index(
    store: Store, plan_kind: str
) -> None:
    """The claim of a tenant alone runs on the connections that plan once (its generic
    plan): it must read that tenant's due range of the claim index, bounded by the due
    time, with 20,000 parked timers of the tenant behind it, and take the chosen tasks by
    id. (Its generic plan, expecting a tenth of the due tasks, hashed a scan of every task
    to update them, until the update read them by key.)"""
    d = await _parked_timers(store)
    params = {**_claim_params(d), "tenant": "default"}
    if plan_kind == "custom":
        plan = await _custom_plan(store, "claim_tasks_one_tenant", params)
    else:
        plan = await _generic_plan(store, "claim_tasks_one_tenant", CLAIM_TYPES, params)
    scans = _task_scans(plan)
    assert set(scans) == {
        ("Index Scan", "toolkit_tasks_tenant_due"), ("Index Scan", "toolkit_tasks_pkey")
    }, scans  # fmt: skip
    for node in _nodes(plan):
        if node.get("Index Name") == "toolkit_tasks_tenant_due":
            condition = node["Index Cond"]
            assert "tenant" in condition and "<=" in condition, condition
    # read in due order off the index (no sort of the due tasks), then updated by key
    (cte,) = [node for node in _nodes(plan) if node.get("Subplan Name") == "CTE candidates"]
    assert not [node for node in _nodes(cte) if node["Node Type"] == "Sort"], cte


async def test_the_hot_statements_connections_plan_once(store: Store) -> None:
    """The claim and the group commit borrow connections that use generic plans from a
    statement's first execution (docs/decisions.md, "The hot statements are planned once");
    every other statement keeps PostgreSQL's default choice."""
    async with store.db.connection(plan_once=True) as conn:
        cursor = await conn.execute("SHOW plan_cache_mode")
        assert await cursor.fetchone() == ("force_generic_plan",)
        cursor = await conn.execute("SHOW jit")
        assert await cursor.fetchone() == ("off",)
    async with store.db.connection() as conn:
        cursor = await conn.execute("SHOW plan_cache_mode")
        assert await cursor.fetchone() == ("auto",)


async def test_claim_bounds_its_index_scan_by_due_time(store: Store) -> None:
    d = await _mixed(store)
    (scan,) = [
        node
        for node in _nodes(_per_tenant(await _custom_plan(store, "claim_tasks", _claim_params(d))))
        if node.get("Index Name") == "toolkit_tasks_tenant_due"
    ]
    assert "Index Cond" in scan


async def _parked_timers(store: Store) -> WorkflowDefinition:
    """20,000 timers of one tenant (``default``, ready), none due, the table analyzed."""
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    async with store.db.connection() as conn:
        await conn.execute(
            "INSERT INTO toolkit_tasks (definition_name, definition_version, definition_digest,"
            " input, checkpoint, state, wait_reason, run_at) SELECT %s, %s, %s, '{}', '{}',"
            " 'waiting', 'timer', now() + interval '1 hour' + i * interval '1 ms'"
            " FROM generate_series(1, 20000) i",
            (d.name, d.version, d.digest),
        )
        await conn.execute("INSERT INTO toolkit_tenants (tenant, ready) VALUES ('default', true)"
                           " ON CONFLICT (tenant) DO UPDATE SET ready = true")  # fmt: skip
        await conn.execute("ANALYZE toolkit_tasks")
    return d


async def test_idle_state_reads_no_whole_table(store: Store) -> None:
    d = await _mixed(store)
    plan = await _custom_plan(store, "idle_state", {"digests": [d.digest]})
    assert ("Seq Scan", None) not in _task_scans(plan)


async def test_idle_state_reads_no_parked_timer_of_a_tenant_that_has_many(store: Store) -> None:
    """Regression (issue 20): with every timer in one tenant and none due, the planner took a
    scan of the whole table for the "waiting and due" probe (it cannot see the bound's value
    and expected a first row at once), so an idle worker's check grew with the parked tasks:
    0.4 ms with 1,000, 30 ms with 100,000. In index order the probe reads the due range."""
    d = await _parked_timers(store)
    plan = await _custom_plan(store, "idle_state", {"digests": [d.digest]})
    scans = _task_scans(plan)
    assert ("Seq Scan", None) not in scans, scans


async def test_the_demotion_reads_no_parked_timer_of_a_tenant_that_has_many(store: Store) -> None:
    """Regression (issue 20, migration 0021): the demotion of a dry tenant probed for a due
    task with EXISTS, whose ORDER BY PostgreSQL drops; the planner then scanned the whole
    table, and every claim that found a tenant dry read all of its parked tasks (50 ms with
    100,000 timers). Counted from the transaction's own table statistics."""
    await _parked_timers(store)
    async with store.db.connection() as conn:
        async with conn.transaction(force_rollback=True):
            await conn.execute("SELECT toolkit_demote_tenants(ARRAY['default'])")
            cursor = await conn.execute(
                "SELECT seq_scan, seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables"
                " WHERE relname = 'toolkit_tasks'"
            )
            read = await cursor.fetchone()
            cursor = await conn.execute(
                "SELECT ready, next_due > now() FROM toolkit_tenants WHERE tenant = 'default'"
            )
            tenant = await cursor.fetchone()
    assert tenant == (False, True), tenant  # demoted until its first timer
    assert read is not None and read[0] == 0 and read[2] <= 10, read


async def test_idle_state_probes_only_the_tenants_of_the_rotation(store: Store) -> None:
    """Regression (issue 20): the idle check probed every unpaused tenant's tasks, three
    index probes each (1.0 s at 100,000 tenants, and as much again in JIT compilation); it
    now probes the ready tenants and those whose next_due has come, and takes the others'
    earliest next_due as a bound. Counted from the transaction's own index scans."""
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    async with store.db.connection() as conn:
        await conn.execute(
            "INSERT INTO toolkit_tenants (tenant, ready, next_due) SELECT format('t%%s', i),"
            " false, now() + interval '1 hour' FROM generate_series(1, %s) i",
            (3000,),
        )
        await conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint, state, wait_reason, run_at)"
            " SELECT format('t%%s', i), %s, %s, %s, '{}', '{}', 'waiting', 'timer',"
            " now() + interval '1 hour' FROM generate_series(1, 3000) i",
            (d.name, d.version, d.digest),
        )
        await conn.execute("ANALYZE toolkit_tasks")
        await conn.execute("ANALYZE toolkit_tenants")
        async with conn.transaction(force_rollback=True):
            cursor = await conn.execute(query("idle_state"), {"digests": [d.digest]})
            pending, next_due = await cursor.fetchone() or (None, None)
            cursor = await conn.execute(
                "SELECT idx_scan, seq_scan FROM pg_stat_xact_user_tables"
                " WHERE relname = 'toolkit_tasks'"
            )
            scans = await cursor.fetchone()
    assert pending is False and next_due is not None and 3500 < next_due <= 3600, next_due
    assert scans is not None and scans[0] <= 10 and scans[1] == 0, scans


async def test_the_store_connections_run_without_jit(store: Store) -> None:
    """A planner estimate past jit_above_cost compiled the idle check for 1.2 s on a server
    with JIT (100,000 tenants); the store's statements are short and never worth it."""
    async with store.db.connection() as conn:
        cursor = await conn.execute("SHOW jit")
        assert await cursor.fetchone() == ("off",)


#: The types of the fenced write's named parameters (commit_fenced).
COMMIT_TYPES = {"worker_id": "text", "writes": "jsonb", "tenant": "text", "wake_within": "text"}


async def _commit_params(store: Store) -> dict[str, Any]:
    """A group commit's parameters: a step's write for each of eight leased tasks."""
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT id, tenant FROM toolkit_tasks WHERE state = 'leased' ORDER BY id LIMIT 8"
        )
        leased = await cursor.fetchall()
    writes = [
        {"task_id": task_id, "tenant": tenant, "token": 1, "state": "leased",
         "checkpoint": {"cursor": "b"}, "write_id": "1:1", "evidence": [], "events": []}
        for task_id, tenant in leased
    ]  # fmt: skip
    return {"worker_id": "other-worker", "writes": json.dumps(writes), "tenant": None,
            "wake_within": None}  # fmt: skip


@pytest.mark.parametrize("statement", ["commit_fenced", "commit_step"])
@pytest.mark.parametrize("plan_kind", ["custom", "generic"])
async def test_the_fenced_write_reads_each_task_by_its_key(
    store: Store, plan_kind: str, statement: str
) -> None:
    """Regression (issue 22): to find writes sent again (their write_id already stored), the
    group commit joined its batch with the task table; expecting a hundred writes in the
    batch, the planner hashed a scan of every task, once per group commit. At 2,000 five-step
    workflows that scan was a third of the server's CPU, and it grows with the table (until
    the planner prefers the index, some tens of thousands of tasks later). The group commit
    runs its generic plan from the first execution on (the connections that plan once), so
    no table that grows with tasks is scanned whole in either plan."""
    await _mixed(store)
    params = await _commit_params(store)
    if plan_kind == "custom":
        plan = await _custom_plan(store, statement, params)
    else:
        plan = await _generic_plan(store, statement, COMMIT_TYPES, params)
    scans = _task_scans(plan)
    assert scans and ("Seq Scan", None) not in scans, scans
    whole = {node.get("Relation Name") for node in _nodes(plan) if node["Node Type"] == "Seq Scan"}
    assert whole <= {"toolkit_tenant_budgets"}, whole  # a row per tenant and resource


@pytest.mark.parametrize("statement", ["commit_fenced", "commit_step"])
async def test_the_fenced_write_locks_its_batch_by_key_not_the_fleets_leases(
    store: Store, statement: str
) -> None:
    """Regression (issue 22): the fenced write's lock (CTE locked) joined its batch, which the
    planner expects a hundred writes in, with the tasks whose lease the writer holds; its
    generic plan read the index of every live lease and filtered by owner, once per group
    commit. With 3,000 leases of other workers that read was 1.3 ms of a 2.1 ms statement of
    8 writes, and it grows with the fleet. The batch's tasks are now read by key."""
    await _mixed(store)
    async with store.db.connection() as conn:
        await conn.execute(
            "UPDATE toolkit_tasks SET state = 'leased', lease_token = 1,"
            " lease_owner = 'fleet-' || (id % 50), lease_expires_at = now() + interval '1 hour'"
            " WHERE state = 'succeeded' AND id % 4 <> 0"
        )
        await conn.execute("VACUUM (ANALYZE) toolkit_tasks")
    plan = await _generic_plan(store, statement, COMMIT_TYPES, await _commit_params(store))
    (locked,) = [node for node in _nodes(plan) if node.get("Subplan Name") == "CTE locked"]
    scans = _task_scans(locked)
    assert scans and {index for _, index in scans} == {"toolkit_tasks_pkey"}, scans


@pytest.mark.parametrize("batch", [16, 32])
async def test_the_fair_claim_handles_a_bounded_number_of_rows(store: Store, batch: int) -> None:
    """Regression (issue 22): the fair claim reads up to 16 due tasks for each tenant of its
    window (32 tenants) and locks the best of them. It joined every row read with the task
    table as the planner, expecting a handful, chose: each of 512 rows compared with the 512
    rows read by key (131,072 comparisons, 13 ms of a 15 ms claim). Now the rows it locks are
    read by key and ordered by their place in the batch's order, and a batch above 16 reads
    no more than one of 16 (it takes more of the rows read; docs/tenants.md). Run for real
    (its generic plan, rolled back): no node of the plan handles more than twice the rows a
    batch of 16 reads. (PostgreSQL 15 chose that join; the embedded server's version hashes
    the rows.)"""
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    for tenant in range(10, 74):
        await store.tasks.submit(d, [{}] * 32, tenant=f"t{tenant}")
    async with store.db.connection() as conn:
        await conn.execute("ANALYZE")
    params = {
        **_claim_params(d), "locked": [], "limit": batch, "window": rotation.window(batch),
        "per_tenant": rotation.per_tenant(batch),
    }  # fmt: skip
    plan = await _generic_plan(store, "claim_tasks", CLAIM_TYPES, params, analyze=True)
    assert plan["Actual Rows"] == batch  # the batch was claimed
    handled = {
        f"{node['Node Type']} {node.get('Relation Name', '')}".strip():
            node["Actual Rows"] * node["Actual Loops"]
        for node in _nodes(plan)
    }  # fmt: skip
    read = 32 * 16
    assert max(handled.values()) <= 2 * read, sorted(handled.items(), key=lambda kv: -kv[1])


async def test_the_fair_claim_reads_a_tenants_backlog_in_claim_order_as_the_worker_runs_it(
    store: Store,
) -> None:
    """Regression (issue 22): on the worker's connections (generic plans from the first
    execution, the parameters typed as psycopg sends them), the fair claim read each tenant
    of its window off a bitmap of the claim index: every due task of the tenant, sorted, to
    take 16. With 100 tenants of 200 due tasks each, 23 ms a claim against 7 ms for an index
    scan in claim order, and it grows with a tenant's backlog. Those connections now plan
    without bitmap scans. The claim is run as the worker runs it, and its plan read from
    auto_explain (rolled back; bench/tenant_scale.py seeds its tasks the same way)."""
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    async with store.db.connection() as conn:
        await conn.execute(
            "INSERT INTO toolkit_tenants (tenant)"
            " SELECT format('t%%s', n) FROM generate_series(0, %s - 1) n",
            (100,),
        )
        await conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint)"
            " SELECT format('t%%s', i %% 100), %s, %s, %s, '{}', %s"
            " FROM generate_series(0, 19999) i",
            (d.name, d.version, d.digest, Jsonb(Checkpoint.initial(d.start).to_json())),
        )
        await conn.execute("ANALYZE")
    plans: list[str] = []

    def explained(notice: psycopg.errors.Diagnostic) -> None:
        plans.append(notice.message_primary or "")

    try:
        async with store.db.connection(plan_once=True) as conn:
            await conn.execute("LOAD 'auto_explain'")
            for setting in ("log_analyze = on", "log_level = notice", "log_min_duration = 0"):
                await conn.execute(f"SET auto_explain.{setting}")
            conn.add_notice_handler(explained)
            try:
                async with conn.transaction(force_rollback=True):
                    cursor = await conn.execute(
                        query("claim_tasks"), {**_claim_params(d), "locked": []}, prepare=True
                    )
                    assert len(await cursor.fetchall()) == 16
            finally:
                conn.remove_notice_handler(explained)
                await conn.execute("SET auto_explain.log_min_duration = -1")
    except StoreError as exc:
        if "auto_explain" not in str(exc):
            raise
        pytest.skip(f"no auto_explain on this server (the embedded one ships without): {exc}")
    (plan,) = [each for each in plans if "Claims up to" in each]
    reads = [line.strip() for line in plan.splitlines() if "toolkit_tasks_tenant_due" in line]
    assert reads and all(line.startswith("->  Index Scan") for line in reads), plan
