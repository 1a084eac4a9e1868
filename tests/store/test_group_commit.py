"""The group commit writer (``toolkit.store.group_commit``) and fenced writes sent again: a
write that cannot be sent fails alone, writes of one task apply in order, a resent write once."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anyio
import psycopg
import pytest
from anyio.abc import TaskGroup
from psycopg.types.json import Jsonb

from tests.helpers.inprocess import sql, submit
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.errors import StoreError
from toolkit.lifecycle import EventKind, TaskState
from toolkit.store import Store
from toolkit.store.database import load_json
from toolkit.store.fence import Fence
from toolkit.store.group_commit import GroupCommit
from toolkit.store.leases import ClaimedTask, _lean
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


async def test_a_claim_reads_json_columns_as_the_standard_decoder_reads_them(
    store: Store,
) -> None:
    """JSON columns are read by orjson, which reads an integer past 64 bits as a float: text
    with a run of 19 digits is read by the standard decoder, so a claimed task's input comes
    back exactly."""
    d = definition(THREE_STEPS)
    value = {"n": 1, "big": 2**70 + 1, "low": -(2**63) - 1, "u64": 2**64 - 1, "f": 0.1,
             "long": 0.12345678901234568, "text": "é☃",
             "nested": [{"a": None, "b": True}]}  # fmt: skip
    await submit(store, THREE_STEPS, [value])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    assert task.input == value and type(task.input["big"]) is int, task.input


@pytest.mark.parametrize(
    "text",
    [b'{"n": 1180591620717411303425}', b"-9223372036854775809", b"[18446744073709551615]",
     b'{"a": 0.1, "b": 1e-7, "c": 12.5}', b'"\\ud800"', b"[[[[]]]]",
     b'{"x": "1234567890123456789"}', b"5e-324", b'{"a": 1, "a": 2}'],
)  # fmt: skip
def test_load_json_reads_as_the_standard_decoder(text: bytes) -> None:
    got, expected = load_json(text), json.loads(text)
    assert got == expected and repr(got) == repr(expected), (got, expected)


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


async def test_a_write_whose_cycle_stops_waiting_applies_and_the_writer_goes_on(
    store: Store,
) -> None:
    """A cycle cancelled while its write waits for the batch: the write applies all the same
    (it carries what the cycle handed over), and the writer goes on to the next batch."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    first = FencedWrite(task.fence("w"), {**task.checkpoint, "cursor": "second"})
    then = FencedWrite(task.fence("w"), {**task.checkpoint, "cursor": "third"})
    async with anyio.create_task_group() as tg:
        writer = await _running_writer(tg, store)
        with anyio.CancelScope() as waiting:
            waiting.cancel()  # delivered while the write waits for its batch
            await writer.commit(first)
        assert waiting.cancelled_caught
        with anyio.fail_after(10):
            while (row := await store.tasks.get(task.id)).checkpoint["cursor"] != "second":
                await anyio.sleep(0.01)
        assert await writer.commit(then) == "leased", row
        tg.cancel_scope.cancel()
    assert (await store.tasks.get(task.id)).checkpoint["cursor"] == "third"


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


async def _run(
    store: Store, name: str, writes: list[FencedWrite]
) -> list[tuple[int, str | None]]:
    """Run ``name`` on ``writes`` (lean for commit_step); (id, state) of each row returned,
    the state None for a write referred back."""
    lean = name == "commit_step"
    params = {"worker_id": "w", "writes": Jsonb([write_json(w, lean=lean) for w in writes]),
              "tenant": None, "wake_within": None}  # fmt: skip
    async with store.db.connection() as conn:
        cursor = await conn.execute(query(name), params)
        return [(row[0], row[1]) for row in await cursor.fetchall()]


_STORED = (
    "SELECT state, checkpoint, tags, run_at, lease_expires_at, result, error, finished_at,"
    " lease_owner, (SELECT json_agg(json_build_array(occurrence, record, result, fencing_token))"
    "  FROM toolkit_effect_evidence e WHERE e.task_id = t.id),"
    " (SELECT json_agg(json_build_array(kind, detail, fencing_token) ORDER BY id)"
    "  FROM toolkit_task_events v WHERE v.task_id = t.id)"
    " FROM toolkit_tasks t WHERE id = ANY(%s) ORDER BY id = %s"
)


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
    rows = await sql(store, _STORED, [lean.id, full.id], lean.id)
    assert rows[0][1:4] == rows[1][1:4] and rows[0][5:] == rows[1][5:], rows
    assert rows[0][0] == "leased" and rows[0][4] is not None, rows


def _end_write(task: ClaimedTask, **changes: Any) -> FencedWrite:
    """A one-step task's last write: its step's evidence and its end."""
    step = _step_write(task)
    return dataclasses.replace(
        step, checkpoint={**task.checkpoint, "cursor": None, **changes}, state="succeeded",
        result={"v": 1}, events=(Event("succeeded"),),
    )  # fmt: skip


@pytest.mark.one_postgresql  # (a store distributed by tenant writes by commit_fenced_on_shard)
async def test_an_end_by_commit_step_stores_what_commit_fenced_stores(store: Store) -> None:
    """commit_step (issue 22) also ends a task whose end does nothing beyond its row: the
    same row, evidence and events as commit_fenced, a stale token refused, a write sent again
    applied once."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}, {"n": 1}])
    lean, full = await store.leases.claim("w", [d.digest], 2, 30.0)
    stale = dataclasses.replace(lean, token=lean.token - 1)
    assert await _run(store, "commit_step", [_end_write(stale)]) == []
    assert await _run(store, "commit_step", [_end_write(lean)]) == [(lean.id, "succeeded")]
    assert await _run(store, "commit_fenced", [_end_write(full)]) == [(full.id, "succeeded")]
    assert await _run(store, "commit_step", [_end_write(lean)]) == [(lean.id, "succeeded")]
    rows = await sql(store, _STORED, [lean.id, full.id], lean.id)
    assert rows[0][:7] == rows[1][:7] and rows[0][8:] == rows[1][8:], rows
    assert rows[0][0] == "succeeded" and rows[0][7] is not None, rows


#: Row surgery giving a leased task an end that does more than its row (task_ended,
#: woken_parents, budget_use), and what a write carries for it.
_ENDS_THAT_DO_MORE = {
    "awaited": ("UPDATE toolkit_tasks SET awaited = true WHERE id = %s", {}),
    "key holder": (
        "UPDATE toolkit_tasks SET concurrency_key = 'k', concurrency_limit = 1,"
        " key_held = true WHERE id = %s", {},
    ),
    "scheduled run": ("UPDATE toolkit_tasks SET schedule_name = 's' WHERE id = %s", {}),
    "child": (
        "UPDATE toolkit_tasks SET parent_id = id + 1, parent_occurrence = 'call#1'"
        " WHERE id = %s", {},
    ),
    "reservations": ("SELECT %s", {"fanout": {"reserved": {"tokens": 5}}}),
}  # fmt: skip


@pytest.mark.one_postgresql  # (a store distributed by tenant writes by commit_fenced_on_shard)
@pytest.mark.parametrize("case", sorted(_ENDS_THAT_DO_MORE))
async def test_commit_step_refers_back_an_end_that_does_more_than_its_row(
    store: Store, case: str
) -> None:
    """commit_step leaves out what a task's end does beyond its row: a lean write that ends a
    task whose end does more is referred back, read off the row as locked (a task awaited
    after it was claimed too), and its batch with it: nothing of the batch is applied."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}, {"n": 1}])
    task, bare = await store.leases.claim("w", [d.digest], 2, 30.0)
    surgery, carried = _ENDS_THAT_DO_MORE[case]
    await sql(store, surgery, task.id)
    writes = [_end_write(task, **carried), _end_write(bare)]
    assert await _run(store, "commit_step", writes) == [(task.id, None)]
    for row in await sql(store, _STORED, [task.id, bare.id], task.id):
        assert row[0] == "leased" and row[9] is None, row  # no evidence
        assert [event[0] for event in row[10]] == ["submitted", "claimed"], row


async def test_a_lean_batch_with_an_end_referred_back_commits_whole_or_not_at_all(
    store: Store,
) -> None:
    """Regression (issue 22, found in review): commit_step applied the rest of a batch whose
    end it referred back, and the end went by commit_fenced in a transaction of its own; when
    the database refused that one, the batch was half written, though commit_many promises
    that a refused batch wrote nothing (the group commit then sends each write alone: one
    without a write id was applied twice). The batch now goes whole by commit_fenced."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}, {"n": 1}])
    refused, step = await store.leases.claim("w", [d.digest], 2, 30.0)
    await sql(
        store, "INSERT INTO toolkit_tenant_budgets (tenant, resource, amount)"
        " VALUES (%s, 'tokens', 100)", refused.tenant,
    )  # fmt: skip
    # a reservation the budget row cannot take back: the database refuses the end
    writes = [_end_write(refused, fanout={"reserved": {"tokens": "x"}}), _step_write(step)]
    assert all(map(_lean, writes))
    with pytest.raises(StoreError):
        await store.leases.commit_many(writes)
    for row in await sql(store, _STORED, [refused.id, step.id], step.id):
        assert row[0] == "leased" and "write" not in row[1] and row[9] is None, row


async def test_an_awaited_tasks_lean_end_is_announced(store: Store, dsn: str) -> None:
    """Leases.commit_many sends a lean batch by commit_step and what it refers back by
    commit_fenced: the end of a task awaited while it ran is announced, the others applied."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}, {"n": 1}])
    awaited, bare = await store.leases.claim("w", [d.digest], 2, 30.0)
    await sql(store, "UPDATE toolkit_tasks SET awaited = true WHERE id = %s", awaited.id)
    writes = [_end_write(awaited), _end_write(bare)]
    assert all(map(_lean, writes))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN toolkit_task_ended")
        applied = await store.leases.commit_many(writes)
        heard = [n.payload async for n in listener.notifies(timeout=5.0, stop_after=1)]
    assert applied == {awaited.id: "succeeded", bare.id: "succeeded"}
    assert heard == [str(awaited.id)]
    assert [len(await store.tasks.evidence(t.id)) for t in (awaited, bare)] == [1, 1]


async def test_only_a_write_that_keeps_its_lease_or_ends_and_releases_no_slot_is_lean(
    store: Store,
) -> None:
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    step = _step_write(task)
    assert _lean(step)
    assert _lean(_end_write(task))
    assert _lean(dataclasses.replace(step, state=TaskState.FAILED, error={"name": "X"}))
    assert not _lean(_step_write(task, limited=True))  # its slots are released
    assert not _lean(dataclasses.replace(step, state=TaskState.WAITING, wait_reason="timer"))
    assert not _lean(dataclasses.replace(step, state=TaskState.QUEUED))
    assert not _lean(dataclasses.replace(step, signals=((1, "wait#1"),)))
    assert not _lean(dataclasses.replace(step, budget_delta={"usd": 1.0}))
    assert not _lean(dataclasses.replace(step, branches_ended=("fan#1",)))
