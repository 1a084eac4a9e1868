"""Acquisitions made at the same moment by one process share a transaction
(toolkit/store/limit_acquisition.py): each is decided on its own, counting what the ones
before it in the batch took, and each stays fenced by its own lease."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest

from tests.apps.limited import app as limited_app
from tests.helpers.processes import eventually, lock_waits, query
from tests.helpers.workflows import PER_TENANT, SOLO, definition
from toolkit.errors import LeaseLost
from toolkit.store import Store
from toolkit.store.leases import ClaimedTask
from toolkit.store.limits import LimitDeferral, LimitGrant

pytestmark = pytest.mark.anyio

OCCURRENCE = "call#1"


async def claimed(store: Store, text: str, n: int, tenant: str = "default") -> list[ClaimedTask]:
    d = definition(text)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{} for _ in range(n)], tenant=tenant)
    tasks = await store.leases.claim("w", [d.digest], n, 30)
    assert len(tasks) == n
    return sorted(tasks, key=lambda t: t.id)


async def at_once(
    store: Store, tasks: list[ClaimedTask], *names: str
) -> list[LimitGrant | LimitDeferral | BaseException]:
    """Every task acquires ``names`` at the same moment; the outcomes in the tasks' order."""
    outcomes: list[LimitGrant | LimitDeferral | BaseException] = [
        RuntimeError("not run") for _ in tasks
    ]

    async def one(i: int, task: ClaimedTask) -> None:
        try:
            outcomes[i] = await store.limits.acquire(task.fence("w"), OCCURRENCE, names)
        except LeaseLost as exc:
            outcomes[i] = exc

    async with anyio.create_task_group() as group:
        for i, task in enumerate(tasks):
            group.start_soon(one, i, task)
    return outcomes


def slots(store: Store) -> list[tuple[int, str, object]]:
    return query(  # type: ignore[return-value]
        store.db.dsn, "SELECT task_id, scope, acquired_at FROM toolkit_limit_slots ORDER BY task_id"
    )


async def test_a_batch_takes_what_the_limit_has_room_for_in_one_transaction(
    store: Store,
) -> None:
    await store.limits.sync(limited_app.limit_specs)  # llm: 3 at once
    tasks = await claimed(store, SOLO, 5)
    outcomes = await at_once(store, tasks, "llm")
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == ["LimitGrant"] * 3 + ["LimitDeferral"] * 2, outcomes
    taken = slots(store)
    assert [task_id for task_id, _, _ in taken] == [t.id for t in tasks[:3]], taken
    # one transaction: a slot's acquired_at is its transaction's start
    assert len({at for _, _, at in taken}) == 1, taken
    assert (await store.limits.get("llm")).in_use == 3


async def test_a_batch_counts_tokens_and_scopes_as_it_decides(store: Store) -> None:
    await store.limits.sync(limited_app.limit_specs)
    await store.limits.set("paced", rate="1/h", burst=2)
    tasks = await claimed(store, SOLO, 4)
    outcomes = await at_once(store, tasks, "paced")
    assert [type(o) for o in outcomes] == [LimitGrant] * 2 + [LimitDeferral] * 2, outcomes
    # each deferred one waits behind those deferred before it: a token an hour
    delays = [o.delay_seconds for o in outcomes if isinstance(o, LimitDeferral)]
    assert delays == [pytest.approx(3600, abs=2), pytest.approx(7200, abs=2)], outcomes
    assert all(o.reason == "rate" for o in outcomes if isinstance(o, LimitDeferral))
    tokens = query(store.db.dsn, "SELECT tokens FROM toolkit_limit_buckets WHERE name = 'paced'")
    assert tokens[0][0] == pytest.approx(0, abs=0.01), tokens
    # A per-tenant limit: each tenant's scope has its own slot, in the same batch.
    acme = await claimed(store, PER_TENANT, 2, tenant="acme")
    globex = await claimed(store, PER_TENANT, 1, tenant="globex")
    outcomes = await at_once(store, [acme[0], globex[0], acme[1]], "per_tenant")
    assert [type(o) for o in outcomes] == [LimitGrant, LimitGrant, LimitDeferral], outcomes
    scoped = [(task_id, scope) for task_id, scope, _ in slots(store)]
    assert scoped == sorted([(acme[0].id, "acme"), (globex[0].id, "globex")]), scoped


async def test_a_lost_lease_fails_its_own_acquisition_alone(store: Store) -> None:
    await store.limits.sync(limited_app.limit_specs)
    first, second = await claimed(store, SOLO, 2)
    stale = dataclasses.replace(second, token=second.token + 1)
    outcomes = await at_once(store, [stale, first], "solo")
    assert isinstance(outcomes[0], LeaseLost) and isinstance(outcomes[1], LimitGrant), outcomes
    assert [task_id for task_id, _, _ in slots(store)] == [first.id]


@contextlib.asynccontextmanager
async def llm_scope_held(store: Store) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
    """An operator's transaction holding the global bucket of ``llm`` (made first) for the
    block; yields a check that one statement of the database waits for a lock."""
    async with store.db.connection() as conn:
        await conn.execute(
            "INSERT INTO toolkit_limit_buckets (name, scope, tokens) VALUES ('llm', '', 0)"
        )
        await conn.execute("BEGIN")
        await conn.execute(
            "SELECT 1 FROM toolkit_limit_buckets WHERE name = 'llm' AND scope = '' FOR UPDATE"
        )

        async def one_waits() -> bool:
            return await lock_waits(conn) == 1

        try:
            yield one_waits
        finally:
            await conn.execute("COMMIT")


@pytest.mark.one_postgresql  # its instrument: one server's lock waits
async def test_a_leader_cancelled_mid_batch_leaves_the_others_to_the_next(store: Store) -> None:
    """The batch's leader is cancelled while its transaction waits for a scope's lock: the
    transaction takes nothing, and the other acquisition of its batch, with the one queued
    behind, is decided in the next batch."""
    await store.limits.sync(limited_app.limit_specs)
    leader, member, queued = await claimed(store, SOLO, 3)
    outcomes: dict[int, LimitGrant | LimitDeferral] = {}
    leading = anyio.CancelScope()
    leader_gone = anyio.Event()

    async def acquire(task: ClaimedTask) -> None:
        outcomes[task.id] = await store.limits.acquire(task.fence("w"), OCCURRENCE, ["llm"])

    async def lead() -> None:
        try:
            with leading:
                await acquire(leader)
        finally:
            leader_gone.set()

    async with anyio.create_task_group() as group, llm_scope_held(store) as one_waits:
        group.start_soon(lead)
        group.start_soon(acquire, member)  # joins the leader's batch
        await eventually(one_waits, timeout=15, what="the batch waiting for the scope")
        group.start_soon(acquire, queued)  # queued behind the batch in flight
        await anyio.sleep(0.05)
        leading.cancel()
        with anyio.fail_after(15):
            await leader_gone.wait()
    assert set(outcomes) == {member.id, queued.id}, outcomes
    assert all(isinstance(o, LimitGrant) for o in outcomes.values()), outcomes
    assert [task_id for task_id, _, _ in slots(store)] == [member.id, queued.id]


@pytest.mark.one_postgresql  # its instrument: one server's lock waits
async def test_a_heartbeat_does_not_wait_for_an_acquisition_waiting_for_its_scope(
    store: Store,
) -> None:
    """An acquisition waits for its scope's lock (here held by an operator's transaction);
    the worker's heartbeat renews the task's lease meanwhile. (Regression: the acquisition
    locked the task row first, so the heartbeat waited behind it, and on the cluster, where
    every acquisition waits for the buckets' shard lock, heartbeats ran past their interval
    and leases were lost.)"""
    await store.limits.sync(limited_app.limit_specs)
    (task,) = await claimed(store, SOLO, 1)
    outcomes: list[LimitGrant | LimitDeferral] = []

    async def acquire() -> None:
        outcomes.append(await store.limits.acquire(task.fence("w"), OCCURRENCE, ["llm"]))

    async with anyio.create_task_group() as group, llm_scope_held(store) as one_waits:
        group.start_soon(acquire)
        await eventually(one_waits, timeout=15, what="the acquisition waiting")
        with anyio.fail_after(5):
            renewal = await store.leases.renew("w", "i1", [task.fence("w")], 60.0)
    assert list(renewal.renewed) == [task.id], renewal
    assert [type(o) for o in outcomes] == [LimitGrant], outcomes
    assert [task_id for task_id, _, _ in slots(store)] == [task.id]
