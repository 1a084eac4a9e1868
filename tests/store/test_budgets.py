"""Tenant budgets in the store (``toolkit.store.budgets``): reservations taken and returned
by fenced writes and by the end of a task, never over-committed, and the migration that
counts them (a step's reservations: ``tests/engine/test_fanout.py``)."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

from tests.conftest import at_schema_version
from tests.helpers.inprocess import set_tenant_budget, sql, tenant_use
from tests.helpers.workflows import RESERVE, definition
from toolkit.store import Store
from toolkit.store.budgets import Budgets, ReservationOutcome
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio


async def test_a_task_cancelled_after_its_worker_died_mid_step_returns_its_reservation(
    ending: Store,
) -> None:
    """A worker reserved 100, recorded 40 spent and died; the operator cancels the task
    (its lease expired): the 60 not spent return to the tenant (with the end triggers and
    without them: tests/helpers/triggers.py)."""
    store = ending
    await set_tenant_budget(store, "acme", 1000)
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(d, [{"items": [1]}], tenant="acme")
    (task,) = await store.leases.claim("dead", [d.digest], 1, 60)
    fanout = {"occurrence": "fan#1", "branches": {}, "winner": None,
              "reserved": {"tokens": 100}, "spent": {"tokens": 40}}  # fmt: skip
    outcome, _ = await Budgets(store.db).reserve(
        task.fence("dead"), {"tokens": 100},
        {**task.checkpoint, "fanout": fanout}, f"{task.token}:1", {},
    )  # fmt: skip
    assert outcome is ReservationOutcome.RESERVED
    await sql(
        store,
        "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() WHERE id = %s",
        task_id,
    )
    assert await store.tasks.cancel(task_id) == "cancelled"
    assert await tenant_use(store, "acme") == (40, 0)


async def test_the_migration_counts_the_reservations_live_tasks_hold(empty_dsn: str) -> None:
    """Before schema 6 a tenant's use did not say what of it was reserved: the migration
    counts the reservations in live tasks' checkpoints (an ended task's count no more)."""
    at_schema_version(empty_dsn, 5)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO toolkit_tenants (tenant) VALUES ('acme')")
        conn.execute(
            "INSERT INTO toolkit_tenant_budgets (tenant, resource, amount, used)"
            " VALUES ('acme', 'tokens', 1000, 400), ('acme', 'usd', 5, 1)"
        )
        conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint, state, wait_reason)"
            " SELECT 'acme', 'x', 1, 'd', '{}', jsonb_build_object('fanout',"
            "   jsonb_build_object('reserved', jsonb_build_object('tokens', n))), s, r"
            " FROM (VALUES (100, 'waiting', 'reconciliation'), (50, 'queued', NULL),"
            "              (70, 'succeeded', NULL)) AS v(n, s, r)"
        )
    async with await Store.open(empty_dsn) as store:  # migrates
        assert await tenant_use(store, "acme") == (400, 150)
        budget = (await store.tenants.get("acme")).budgets["usd"]
        assert (budget.used, budget.reserved) == (1, 0)


async def test_a_budget_set_while_a_reservation_is_out_counts_only_the_spend(
    store: Store,
) -> None:
    """A reservation taken while the tenant had no tokens budget holds none of the budget
    set later: its release counts what it spent, and takes nothing back it never took."""
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    ended = []
    for items in ([10, 20], [5]):
        await store.tasks.submit(d, [{"items": items}], tenant="acme")
        (task,) = await store.leases.claim("w", [d.digest], 1, 60)
        fanout = {"occurrence": "fan#1", "branches": {}, "winner": None,
                  "reserved": {"tokens": 100}, "spent": {"tokens": float(sum(items))}}  # fmt: skip
        outcome, _ = await Budgets(store.db).reserve(
            task.fence("w"), {"tokens": 100},
            {**task.checkpoint, "fanout": fanout}, f"{task.token}:1", {},
        )  # fmt: skip
        assert outcome is ReservationOutcome.RESERVED  # no tokens budget: nothing taken
        ended.append((task, fanout))
    await set_tenant_budget(store, "acme", 1000)
    (first, fanout), (second, _) = ended
    # The step ends: the engine's release (30 spent, 100 returned).
    release = FencedWrite(
        first.fence("w"), {**first.checkpoint, "fanout": None}, state="succeeded",
        budget_delta={"tokens": -70.0}, budget_released={"tokens": 100.0},
    )  # fmt: skip
    assert await store.leases.commit(release) == "succeeded"
    assert await tenant_use(store, "acme") == (30, 0)
    # The task ends holding it (cancelled once its lease expired): the trigger's release.
    await sql(store, "UPDATE toolkit_tasks SET lease_expires_at = now() WHERE id = %s",
              second.id)  # fmt: skip
    assert await store.tasks.cancel(second.id) == "cancelled"
    assert await tenant_use(store, "acme") == (35, 0)


async def test_a_reservation_that_can_never_fit_on_one_resource_is_not_deferred(
    store: Store,
) -> None:
    """``tokens`` is held by another task now, ``zeta`` can never give 1000: never, not later
    (though ``tokens`` comes first)."""
    await set_tenant_budget(store, "acme", 100, used=95, reserved=95)
    await sql(
        store,
        "INSERT INTO toolkit_tenant_budgets (tenant, resource, amount) VALUES ('acme', 'zeta', 50)",
    )
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{"items": [1]}], tenant="acme")
    (task,) = await store.leases.claim("w", [d.digest], 1, 60)
    outcome = await Budgets(store.db).reserve(
        task.fence("w"), {"tokens": 10, "zeta": 1000},
        task.checkpoint, f"{task.token}:1", {},
    )  # fmt: skip
    assert outcome == (ReservationOutcome.NEVER, "zeta")


async def test_concurrent_reservations_never_over_commit_a_tenant_budget(store: Store) -> None:
    """40 leased tasks race to reserve 100 each from a budget of 1,000: exactly 10 get it."""
    await set_tenant_budget(store, "acme", 1000)
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{"items": [1]}] * 40, tenant="acme")
    claimed = await store.leases.claim("racer", [d.digest], 40, 60)
    assert len(claimed) == 40
    budgets = Budgets(store.db)
    outcomes: list[ReservationOutcome] = []

    async def reserve(task: Any) -> None:
        outcome, _ = await budgets.reserve(
            task.fence("racer"), {"tokens": 100},
            {**task.checkpoint, "reserved": True}, f"{task.token}:1", {},
        )  # fmt: skip
        outcomes.append(outcome)

    async with anyio.create_task_group() as group:
        for task in claimed:
            group.start_soon(reserve, task)
    assert outcomes.count(ReservationOutcome.RESERVED) == 10
    assert outcomes.count(ReservationOutcome.LATER) == 30
    assert await tenant_use(store, "acme") == (1000, 1000)
