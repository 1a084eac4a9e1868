"""Priority against a real PostgreSQL (docs/flow-control.md#priority): inside a tenant's share
a due task of priority p is claimed as if it had been due p minutes earlier."""

from __future__ import annotations

import anyio
import pytest

from tests.helpers.inprocess import invoke, sql
from tests.helpers.processes import query
from tests.helpers.workflows import definition
from toolkit.errors import InputError
from toolkit.store import Store

pytestmark = pytest.mark.anyio

ONE_STEP = """
name: prioritised
version: 1
input: {type: object}
priority: PRIORITY
start: work
steps:
  work: {effect: count.work, idempotent: true}
"""


async def test_a_burst_of_high_priority_runs_before_the_low_backlog(store: Store) -> None:
    """One claimer taking one task at a time (a worker at concurrency 1): 1,000 low tasks,
    then 20 high ones; the high ones are the next 20 claimed, then the low ones in order."""
    d = definition(ONE_STEP.replace("PRIORITY", "0"))
    await store.definitions.deploy(d)
    low = await store.tasks.submit(d, [{"n": n} for n in range(1_000)])
    first = await store.leases.claim("w", [d.digest], 1, 30)
    high = await store.tasks.submit(d, [{"high": n} for n in range(20)], priority=9)
    order = []
    for _ in range(40):
        (task,) = await store.leases.claim("w", [d.digest], 1, 30)
        order.append(task.id)
    assert [t.id for t in first] == low[:1]
    assert order == high + low[1:21], order


async def test_the_definitions_priority_and_a_submits_override(store: Store) -> None:
    d = definition(ONE_STEP.replace("PRIORITY", "5"))
    await store.definitions.deploy(d)
    ids = await store.tasks.submit(d, [{}])
    ids += await store.tasks.submit(d, [{}], priority=1)
    ids += [(await store.tasks.submit_keyed(d, {}, key="k", priority=7))[0]]
    rows = await sql(
        store, "SELECT priority FROM toolkit_tasks WHERE id = ANY(%s) ORDER BY id", ids
    )
    assert rows == [(5,), (1,), (7,)]
    with pytest.raises(InputError, match="priority must be an integer from 0 to 9"):
        await store.tasks.submit(d, [{}], priority=10)


async def test_ageing_a_low_task_due_long_enough_before_goes_first(store: Store) -> None:
    """The credit is a minute per level: a priority-0 task due 10 minutes before a priority-9
    one is still claimed first (the bound on how long low priority waits)."""
    d = definition(ONE_STEP.replace("PRIORITY", "0"))
    await store.definitions.deploy(d)
    (old,) = await store.tasks.submit(d, [{}])
    await sql(store, "UPDATE toolkit_tasks SET run_at = toolkit_seconds_after(run_at, -600)"
                     " WHERE id = %s RETURNING id", old)  # fmt: skip
    (recent,) = await store.tasks.submit(d, [{}], priority=9)
    claimed = await store.leases.claim("w", [d.digest], 2, 30)
    assert [t.id for t in claimed] == [old, recent]


async def test_a_high_priority_task_is_not_claimed_before_it_is_due(store: Store) -> None:
    d = definition(ONE_STEP.replace("PRIORITY", "9"))
    await store.definitions.deploy(d)
    (later,) = await store.tasks.submit(d, [{}], delay=60)
    assert await store.leases.claim("w", [d.digest], 5, 30) == []
    pending, next_due = await store.tasks.idle_state([d.digest])
    # its claim time (9 minutes before its start) has passed: the exact due time is read
    assert not pending and next_due is not None and 50 < next_due <= 60, next_due
    assert (await store.tasks.get(later)).state == "waiting"


def test_show_says_why_a_due_task_is_not_running(dsn: str) -> None:
    d = definition(ONE_STEP.replace("PRIORITY", "0"))

    async def setup() -> tuple[list[int], int]:
        async with await Store.open(dsn, migrate_schema=False) as store:
            await store.definitions.deploy(d)
            ids = await store.tasks.submit(d, [{}] * 3)
            (urgent,) = await store.tasks.submit(d, [{}], priority=4)
            return ids, urgent

    ids, urgent = anyio.run(setup)
    code, out, _ = invoke(dsn, "show", str(ids[2]))
    assert code == 0
    assert "no live worker has loaded its definition version" in out, out
    query(dsn, "INSERT INTO toolkit_workers (worker_id, pid, host, concurrency, definitions,"
               " lease_seconds, heartbeat_seconds, expires_at) VALUES ('w', 1, 'h', 1,"
               " jsonb_build_array(jsonb_build_object('digest', %s::text)), 30, 5,"
               " now() + interval '1 minute') RETURNING worker_id", (d.digest,))  # fmt: skip
    out = invoke(dsn, "show", str(ids[2]))[1]
    assert "waits for a worker; 3 due task(s) of its tenant before it in claim order" in out, out
    out = invoke(dsn, "show", str(urgent))[1]
    assert "priority:   4" in out and "0 due task(s) of its tenant before it" in out, out
    query(dsn, "UPDATE toolkit_tenants SET paused = true RETURNING tenant")
    assert "its tenant is paused" in invoke(dsn, "show", str(ids[0]))[1]
