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
