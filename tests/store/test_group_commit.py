"""The group commit writer (``toolkit.store.group_commit``) and fenced writes sent again: a
write that cannot be sent fails alone, writes of one task apply in order, a resent write once."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import TaskGroup
from psycopg.types.json import Jsonb

from tests.helpers.inprocess import submit
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.errors import StoreError
from toolkit.lifecycle import TaskState
from toolkit.store import Store
from toolkit.store.group_commit import GroupCommit
from toolkit.store.queries import query
from toolkit.store.writes import Event, EvidenceRecord, FencedWrite, write_json

pytestmark = pytest.mark.anyio


# --- the group commit writer -----------------------------------------------------------------


async def _running_writer(tg: TaskGroup, store: Store) -> GroupCommit:
    writer = GroupCommit(store.leases)
    tg.start_soon(writer.run)
    await anyio.wait_all_tasks_blocked()
    return writer


async def _commit_all(
    writer: GroupCommit, writes: dict[str, FencedWrite]
) -> dict[str, TaskState | BaseException]:
    """Queue every write in the same turn of the loop (one batch); collect each outcome."""
    results: dict[str, TaskState | BaseException] = {}

    async def commit(name: str, write: FencedWrite) -> None:
        try:
            results[name] = await writer.commit(write)
        except Exception as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        for name, write in writes.items():
            tg.start_soon(commit, name, write)
    return results


async def test_group_commit_writer_survives_a_write_the_driver_cannot_send(store: Store) -> None:
    """A value the driver cannot adapt (TypeError, RecursionError) fails that write only."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}, {"n": 2}])
    a, b = await store.leases.claim("w", [d.digest], 2, 30.0)
    async with anyio.create_task_group() as tg:
        writer = await _running_writer(tg, store)
        results = await _commit_all(
            writer,
            {
                "good": FencedWrite(a.fence("w"), a.checkpoint, state="succeeded", result=1),
                "bad": FencedWrite(b.fence("w"), {**b.checkpoint, "x": object()}),
            },
        )
        assert results["good"] == "succeeded"
        assert isinstance(results["bad"], StoreError)
        # The writer still runs: the task of the refused write can still be failed cleanly.
        failed = FencedWrite(b.fence("w"), b.checkpoint, state="failed", error={"name": "X"})
        assert await writer.commit(failed) == "failed"
        tg.cancel_scope.cancel()


async def test_two_writes_of_one_task_in_one_batch_apply_in_order(store: Store) -> None:
    """A cycle cancelled while its write waits writes again at once (release, cancel): both
    writes may be queued together; they apply one after the other, never merged."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    record = EvidenceRecord(
        occurrence="first#1", step="first", handler="count.work", idempotent=True,
        idempotency_key=f"{task.id}:first#1", record="completed", attempt=1, result={"v": 1},
    )  # fmt: skip
    progress = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second"}, evidence=(record,)
    )
    release = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second", "steps_run": 1},
        state="queued", delay_seconds=0, events=(Event("released"),),
    )  # fmt: skip
    async with anyio.create_task_group() as tg:
        writer = await _running_writer(tg, store)
        results = await _commit_all(writer, {"progress": progress, "release": release})
        tg.cancel_scope.cancel()
    assert results == {"progress": "leased", "release": "queued"}
    row = await store.tasks.get(task.id)
    assert row.state == "queued" and row.checkpoint["steps_run"] == 1
    assert [e["record"] for e in await store.tasks.evidence(task.id)] == ["completed"]


# --- fenced writes sent again ------------------------------------------------------------------


async def test_a_write_sent_again_after_a_lost_reply_applies_once(store: Store) -> None:
    """The reply of a commit can be lost with its connection; the write is sent again. The
    write id makes the second send a no-op that reports the write applied."""
    d = definition(THREE_STEPS)
    (task_id,) = await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    record = EvidenceRecord(
        occurrence="first#1", step="first", handler="count.work", idempotent=True,
        idempotency_key=f"{task_id}:first#1", record="completed", attempt=1, result={"v": 1},
    )  # fmt: skip
    progress = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second"},
        evidence=(record,), events=(Event("progress"),), write_id=f"{task.token}:1",
    )  # fmt: skip
    assert await store.leases.commit_many([progress]) == {task_id: "leased"}
    assert await store.leases.commit_many([progress]) == {task_id: "leased"}
    done = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": None}, state="succeeded",
        result={"v": 1}, events=(Event("succeeded"),), write_id=f"{task.token}:2",
    )  # fmt: skip
    assert await store.leases.commit(done) == "succeeded"
    assert await store.leases.commit(done) == "succeeded"  # applied, though no lease now
    assert len(await store.tasks.evidence(task_id)) == 1
    kinds = [e["kind"] for e in await store.tasks.events(task_id)]
    assert kinds == ["submitted", "claimed", "progress", "succeeded"]
    # Without a write id nothing tells a second send from a new write: the fence decides.
    stale = FencedWrite(task.fence("w"), task.checkpoint, state="failed")
    assert await store.leases.commit_many([stale]) == {}


# --- a step's write in place -------------------------------------------------------------------


@pytest.mark.one_postgresql  # (on Citus the update runs on a worker node)
async def test_a_step_write_that_keeps_its_lease_enters_no_index(store: Store) -> None:
    """Regression (issue 22, migration 0036): an index on an expression of the checkpoint made
    every step's write a non-HOT update, entered in each index of a leased task; the limit a
    task waits for is now a generated column, so a step that keeps its lease updates its row
    in place. Counted from the transaction's own table statistics, then rolled back."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    progress = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second", "outputs": {"first": 1}},
        events=(Event("progress"),), write_id=f"{task.token}:1",
    )  # fmt: skip
    params = {"worker_id": "w", "writes": Jsonb([write_json(progress)]), "tenant": None,
              "wake_within": None}  # fmt: skip
    updates = (
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
        " WHERE relname = 'toolkit_tasks'"
    )
    async with store.db.connection() as conn:
        async with conn.transaction(force_rollback=True):
            # (the backend's counts not yet reported, the claim's among them, show too)
            before = await (await conn.execute(updates)).fetchone() or (0, 0)
            cursor = await conn.execute(query("commit_fenced"), params)
            (applied, *_) = await cursor.fetchone() or (None,)
            after = await (await conn.execute(updates)).fetchone() or (0, 0)
    assert applied == task.id
    counts = (after[0] - before[0], after[1] - before[1])
    assert counts == (1, 1), f"updates, of them in place: {counts}"
