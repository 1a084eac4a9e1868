"""Tasks held back by flow control, counted for the ``toolkit_tasks_held`` gauge (issue 20,
docs/flow-control.md "Seeing what is held back")."""

from __future__ import annotations

import pytest

from tests.helpers.workflows import THREE_STEPS, definition
from tests.store.test_concurrency_keys import keyed
from tests.store.test_debounce_throttle import DEBOUNCED
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def test_held_tasks_are_counted_by_definition_and_reason(store: Store) -> None:
    keys, debounced, plain = (
        definition(keyed()),
        definition(DEBOUNCED.replace("QUIET", "1h").replace("MAX_WAIT", "2h")),
        definition(THREE_STEPS),
    )
    for d in (keys, debounced, plain):
        await store.definitions.deploy(d)
    await store.tasks.submit(keys, [{"account": "a"}] * 3)  # one holds the key, two wait
    await store.tasks.submit(debounced, [{"document": "d"}])
    await store.tasks.submit(plain, [{}], delay=3600)
    await store.tenants.set("paused", paused=True)
    await store.tasks.submit(plain, [{}] * 2, tenant="paused")
    await store.tenants.set("limited", max_active=1)
    await store.tasks.submit(plain, [{}] * 3, tenant="limited")
    claimed = await store.leases.claim("w", [plain.digest], 1, 30.0)
    assert [t.tenant for t in claimed] == ["limited"], claimed
    await store.tasks.submit(plain, [{}], tenant="free")  # due, held by nothing
    held = await store.tasks.held()
    assert held == {
        ("keyed", "concurrency"): 2,
        ("debounced", "debounce"): 1,
        (plain.name, "start"): 1,
        (plain.name, "tenant_paused"): 2,
        (plain.name, "tenant_max_active"): 2,
    }, held


async def test_one_worker_of_the_fleet_counts_per_interval_and_the_others_read(
    store: Store,
) -> None:
    """The counts read every live task: a second refresh within the interval reads the
    stored counts instead of counting again (migration 0022)."""
    plain = definition(THREE_STEPS)
    await store.definitions.deploy(plain)
    await store.tenants.set("paused", paused=True)
    await store.tasks.submit(plain, [{}] * 2, tenant="paused")
    first = await store.workers.fleet_counts(15.0)
    assert first.held == {(plain.name, "tenant_paused"): 2}, first
    assert first.unavailable == {(plain.name, plain.version): 2}, first  # no worker serves it
    await store.tasks.submit(plain, [{}], tenant="paused")
    again = await store.workers.fleet_counts(15.0)  # counted less than 15 s ago: read
    assert again == first, again
    fresh = await store.workers.fleet_counts(0.0)  # due: counted again
    assert fresh.held == {(plain.name, "tenant_paused"): 3}, fresh
    assert await store.workers.fleet_counts(15.0) == fresh
