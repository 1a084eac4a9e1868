"""The group commit writer (``toolkit.store.group_commit``) and fenced writes sent again: a
write that cannot be sent fails alone, writes of one task apply in order, a resent write once."""

from __future__ import annotations

import dataclasses
import json

import anyio
import pytest
from anyio.abc import TaskGroup
from psycopg.types.json import Jsonb

from tests.helpers.inprocess import sql, submit
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.errors import StoreError
from toolkit.lifecycle import EventKind, TaskState
from toolkit.store import Store
from toolkit.store.fence import Fence
from toolkit.store.group_commit import GroupCommit
from toolkit.store.leases import ClaimedTask, _step_only
from toolkit.store.queries import query
from toolkit.store.writes import Event, EvidenceRecord, FencedWrite, write_json, writes_param

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


async def test_a_value_orjson_refuses_is_written_as_the_standard_encoder_writes_it(
    store: Store,
) -> None:
    """The writes are encoded by orjson, which refuses integers past 64 bits and keys that
    are not strings; such a write is encoded by the standard encoder, stored exactly."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    big = 2**70 + 1
    checkpoint = {**task.checkpoint, "x": {1: "key not a string"}}
    write = FencedWrite(task.fence("w"), checkpoint, state="succeeded", result={"n": big})
    assert await store.leases.commit(write) == "succeeded"
    ((result, stored),) = await sql(
        store, "SELECT result, checkpoint -> 'x' FROM toolkit_tasks WHERE id = %s", task.id
    )
    assert result == {"n": big}, result
    assert stored == {"1": "key not a string"}, stored


def test_the_writes_parameter_holds_what_the_standard_encoder_would_send() -> None:
    """orjson's text differs from json.dumps's in spacing only (states are strings)."""
    write = FencedWrite(
        Fence("w", 7, "acme", 3), {"cursor": "b", "outputs": {"a": [1, 2.5, None, True]}},
        state=TaskState.LEASED, write_id="3:1",
        evidence=(EvidenceRecord("a", "a", "noop", True, "7:a", "completed", 1, {"é": "☃"}),),
        events=(Event(EventKind.RETRY_SCHEDULED, {"step": "a"}),),
    )  # fmt: skip
    param = writes_param([write, write])
    text = param.dumps(param.obj)
    assert isinstance(text, bytes)  # orjson's
    assert json.loads(text) == json.loads(json.dumps([write_json(write)] * 2))


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


# --- a step's write by the statement without the ends' parts ----------------------------------


async def _run(store: Store, name: str, writes: list[FencedWrite]) -> list[tuple[int, str]]:
    params = {"worker_id": "w", "writes": Jsonb([write_json(w) for w in writes]),
              "tenant": None, "wake_within": None}  # fmt: skip
    async with store.db.connection() as conn:
        cursor = await conn.execute(query(name), params)
        return [(row[0], row[1]) for row in await cursor.fetchall()]


def _step_write(task: ClaimedTask, *, limited: bool = False) -> FencedWrite:
    record = EvidenceRecord(
        occurrence="first#1", step="first", handler="count.work", idempotent=True,
        idempotency_key=f"{task.id}:first#1", record="completed", attempt=1,
        result={"v": 1}, limited=limited,
    )  # fmt: skip
    return FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second"}, evidence=(record,),
        events=(Event("progress"),), tags={"stage": "two"}, write_id=f"{task.token}:1",
    )  # fmt: skip


@pytest.mark.one_postgresql  # (a store distributed by tenant writes by commit_fenced_on_shard)
async def test_a_step_write_by_commit_step_stores_what_commit_fenced_stores(store: Store) -> None:
    """commit_step (issue 22) leaves out of commit_fenced what acts on ends, waits, signals,
    budgets and limit slots; for a write that keeps its lease and carries none of those, the
    two store the same task row, evidence and events, and both refuse a stale token and apply
    a write sent again once."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}, {"n": 1}])
    lean, full = await store.leases.claim("w", [d.digest], 2, 30.0)
    assert await _run(store, "commit_step", [_step_write(lean)]) == [(lean.id, "leased")]
    assert await _run(store, "commit_fenced", [_step_write(full)]) == [(full.id, "leased")]
    assert await _run(store, "commit_step", [_step_write(lean)]) == [(lean.id, "leased")]
    stale = dataclasses.replace(lean, token=lean.token - 1)
    assert await _run(store, "commit_step", [_step_write(stale)]) == []
    rows = await sql(
        store,
        "SELECT state, checkpoint, tags, run_at, lease_expires_at, result, error, finished_at,"
        " (SELECT json_agg(json_build_array(occurrence, record, result, fencing_token))"
        "  FROM toolkit_effect_evidence e WHERE e.task_id = t.id),"
        " (SELECT json_agg(json_build_array(kind, detail, fencing_token) ORDER BY id)"
        "  FROM toolkit_task_events v WHERE v.task_id = t.id)"
        " FROM toolkit_tasks t WHERE id = ANY(%s) ORDER BY id = %s",
        [lean.id, full.id], lean.id,
    )
    assert rows[0][1:4] == rows[1][1:4] and rows[0][5:] == rows[1][5:], rows
    assert rows[0][0] == "leased" and rows[0][4] is not None, rows


async def test_only_a_write_that_keeps_its_lease_and_releases_no_slot_goes_by_commit_step(
    store: Store,
) -> None:
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    step = _step_write(task)
    assert _step_only(step)
    assert not _step_only(_step_write(task, limited=True))  # its slots are released
    assert not _step_only(dataclasses.replace(step, state=TaskState.SUCCEEDED))
    assert not _step_only(dataclasses.replace(step, signals=((1, "wait#1"),)))
    assert not _step_only(dataclasses.replace(step, budget_delta={"usd": 1.0}))
    assert not _step_only(dataclasses.replace(step, branches_ended=("fan#1",)))
