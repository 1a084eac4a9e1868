"""Handler streams against a real PostgreSQL (docs/progress.md): published items are numbered
per task and fenced, progress goes through NOTIFY, and ``follow`` reads both until the end."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.errors import InputError, LeaseLost
from toolkit.store import Store
from toolkit.store.streams import StreamEvent
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio


async def _leased(store: Store) -> Any:
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{"n": 1}])
    (task,) = await store.leases.claim("w1", [d.digest], 1, 30)
    return d, task


async def test_items_are_numbered_in_order_and_a_stale_lease_publishes_nothing(
    store: Store,
) -> None:
    d, task = await _leased(store)
    fence = task.fence("w1")
    assert [await store.streams.publish(fence, "first#1", {"token": t}) for t in "abc"] == [1, 2, 3]
    async with store.db.connection() as conn:  # the lease expires; another worker takes over
        await conn.execute("UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp()"
                           " - interval '1 second' WHERE id = %s", (task.id,))  # fmt: skip
    (again,) = await store.leases.claim("w2", [d.digest], 1, 30)
    with pytest.raises(LeaseLost):
        await store.streams.publish(fence, "first#1", {"token": "late"})
    assert await store.streams.publish(again.fence("w2"), "first#1", {"token": "d"}) == 4
    items = await store.streams.items(task.id)
    assert [(i.seq, i.value["token"]) for i in items] == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert [i.seq for i in await store.streams.items(task.id, after=2)] == [3, 4]


async def test_limits_are_refused_with_a_clear_error(store: Store) -> None:
    _, task = await _leased(store)
    with pytest.raises(InputError, match=r"a published item is \d+ bytes of JSON, more than 65536"):
        await store.streams.publish(task.fence("w1"), "first#1", "x" * 70_000)
    with pytest.raises(InputError, match=r"a progress value is \d+ bytes of JSON, more than 7000"):
        await store.streams.progress(task.id, "x" * 8000)


async def test_follow_reads_items_progress_and_the_end(store: Store) -> None:
    _, task = await _leased(store)
    fence = task.fence("w1")
    await store.streams.publish(fence, "first#1", 1)
    seen: list[StreamEvent] = []
    caught_up, progressed = anyio.Event(), anyio.Event()

    async def follow() -> None:
        async for event in store.streams.follow(task.id, poll=0.2):
            seen.append(event)
            if len(seen) == 2:  # the state, then the item published before
                caught_up.set()
            if event.kind == "progress":
                progressed.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(follow)
            await caught_up.wait()
            await store.streams.progress(task.id, {"done": 50})
            await progressed.wait()
            await store.streams.publish(fence, "first#1", 2)
            write = FencedWrite(fence, {"cursor": None}, state="succeeded", result={"ok": True})
            await store.leases.commit(write)
    kinds = [(e.kind, e.value) for e in seen]
    assert kinds == [("state", "leased"), ("item", 1), ("progress", {"done": 50}), ("item", 2),
                     ("state", "succeeded")], kinds  # fmt: skip
    assert seen[-1].detail == {"result": {"ok": True}}


async def test_a_full_stream_refuses_the_next_item_and_keeps_it_out(store: Store) -> None:
    _, task = await _leased(store)
    async with store.db.connection() as conn:
        await conn.execute("UPDATE toolkit_tasks SET stream_seq = 10000 WHERE id = %s", (task.id,))
    with pytest.raises(InputError, match="has published 10000 items, the most"):
        await store.streams.publish(task.fence("w1"), "first#1", "one too many")
    assert await store.streams.items(task.id) == []
