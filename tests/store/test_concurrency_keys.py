"""Concurrency keys against a real PostgreSQL (docs/flow-control.md): a keyed task waits for
its key, holds it from admission until it ends, and the next is admitted in submission order;
the ``on_conflict`` policies; redrive re-admits. Every test runs with the triggers that
admitted keyed tasks before migration 0031 kept and dropped (the statements do it). The
multi-process ledger run is ``tests/process/test_concurrency_keys.py``."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.helpers.citus import on_citus, skip_kept_triggers
from tests.helpers.inprocess import sql
from tests.helpers.triggers import KEY_TRIGGERS, as_distributed, drop_triggers
from tests.helpers.workflows import definition
from toolkit.definition import WorkflowDefinition
from toolkit.errors import ConcurrencyKeyBusy, DefinitionError, InputError
from toolkit.store import Store
from toolkit.store.leases import ClaimedTask
from toolkit.store.queries import query, query_names
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio

LEASE = 30.0


@pytest.fixture(params=["triggers kept", "triggers dropped", "tenant by tenant"])
async def store(request: pytest.FixtureRequest, store: Store) -> Store:
    """The store as migrated, without the key triggers (as the ``keying`` fixture), and
    running the statements of a store distributed by tenant (key by key admissions), for
    every test of this module; on the cluster, as it is there."""
    skip_kept_triggers(request.config, request.param == "triggers kept")
    if on_citus(request.config):
        if request.param == "tenant by tenant":
            pytest.skip("the cluster's store runs tenant by tenant in every test (--citus)")
        return store
    if request.param == "triggers dropped":
        await drop_triggers(store, KEY_TRIGGERS)
    elif request.param == "tenant by tenant":
        await as_distributed(store)
    return store


def keyed(on_conflict: str = "queue", max_active: int = 1, version: int = 1) -> str:
    return f"""
name: keyed
version: {version}
input: {{type: object}}
concurrency: {{key: "${{ input.account }}", max_active: {max_active}, on_conflict: {on_conflict}}}
start: work
steps:
  work: {{effect: count.work, idempotent: true}}
"""


async def _deployed(store: Store, text: str) -> WorkflowDefinition:
    d = definition(text)
    await store.definitions.deploy(d)
    return d


async def _claim(store: Store, d: WorkflowDefinition, limit: int = 10) -> list[ClaimedTask]:
    return await store.leases.claim("w1", [d.digest], limit, LEASE)


async def _end(store: Store, task: ClaimedTask, state: str = "succeeded") -> None:
    fields: dict[str, Any] = (
        {"result": {}} if state == "succeeded" else {"error": {"name": "X", "step": "work"}}
    )
    write = FencedWrite(task.fence("w1"), task.checkpoint, state=state, **fields)
    assert await store.leases.commit(write) == state


async def _states(store: Store, ids: list[int]) -> list[tuple[Any, ...]]:
    return await sql(
        store,
        "SELECT id, state, wait_reason, key_held FROM toolkit_tasks WHERE id = ANY(%s) ORDER BY id",
        ids,
    )


async def test_one_key_runs_its_tasks_one_at_a_time_in_submission_order(store: Store) -> None:
    d = await _deployed(store, keyed())
    ids = await store.tasks.submit(d, [{"account": "a"}] * 3 + [{"account": "b"}])
    rounds = []
    while claimed := await _claim(store, d):
        rounds.append([task.id for task in claimed])
        for task in claimed:
            await _end(store, task)
    # one task of key a at a time, oldest first; key b does not wait for key a
    assert rounds == [[ids[0], ids[3]], [ids[1]], [ids[2]]], await _states(store, ids)


async def test_a_key_is_held_through_waits_until_the_task_ends(store: Store) -> None:
    d = await _deployed(store, keyed())
    first, second = await store.tasks.submit(d, [{"account": "a"}, {"account": "a"}])
    (task,) = await _claim(store, d)
    assert task.id == first
    write = FencedWrite(task.fence("w1"), {"cursor": "work"}, state="waiting",
                        wait_reason="timer", run_at="2000-01-01T00:00:00+00:00")  # fmt: skip
    await store.leases.commit(write)
    (again,) = await _claim(store, d)  # the timer is due: the holder again, never the second
    assert again.id == first
    await _end(store, again, "failed")
    (third,) = await _claim(store, d)
    assert third.id == second
    detail = await sql(
        store, "SELECT detail FROM toolkit_task_events WHERE task_id = %s AND kind = %s",
        second, "key_admitted",
    )  # fmt: skip
    assert detail == [({"key": "a", "max_active": 1, "holders": 0},)]


async def test_max_active_admits_that_many_of_a_key(store: Store) -> None:
    d = await _deployed(store, keyed(max_active=2))
    ids = await store.tasks.submit(d, [{"account": "a"}] * 5)
    claimed = await _claim(store, d)
    assert [t.id for t in claimed] == ids[:2]
    assert await _claim(store, d) == []
    await _end(store, claimed[1])
    assert [t.id for t in await _claim(store, d)] == [ids[2]]


async def test_skip_refuses_the_submit_and_names_the_holder(store: Store) -> None:
    d = await _deployed(store, keyed("skip"))
    (first,) = await store.tasks.submit(d, [{"account": "a"}])
    with pytest.raises(ConcurrencyKeyBusy, match=rf"key 'a'.*: {first}; not submitted") as info:
        await store.tasks.submit(d, [{"account": "a"}])
    assert info.value.holders == (first,)
    assert await store.tasks.submit(d, [{"account": "b"}])  # another key is free
    again, created = await store.tasks.submit_keyed(d, {"account": "c"}, key="k1")
    assert created
    assert await store.tasks.submit_keyed(d, {"account": "c"}, key="k1") == (again, False)


async def test_cancel_newest_cancels_the_new_task(store: Store) -> None:
    d = await _deployed(store, keyed("cancel_newest"))
    first, second = await store.tasks.submit(d, [{"account": "a"}, {"account": "a"}])
    states = await _states(store, [first, second])
    assert [row[1] for row in states] == ["queued", "cancelled"], states
    assert [t.id for t in await _claim(store, d)] == [first]


async def test_cancel_running_cancels_the_older_tasks_of_the_key(store: Store) -> None:
    d = await _deployed(store, keyed("cancel_running"))
    (first,) = await store.tasks.submit(d, [{"account": "a"}])
    (holder,) = await _claim(store, d)
    (newest,) = await store.tasks.submit(d, [{"account": "a"}])
    task = await store.tasks.get(first)
    assert task.cancel_requested is not None  # a leased holder is asked to stop
    assert f"replaced by task {newest}" in task.cancel_requested["reason"]
    await store.leases.commit(FencedWrite(holder.fence("w1"), {"cursor": None}, state="cancelled"))
    assert [t.id for t in await _claim(store, d)] == [newest]


async def test_a_redriven_task_waits_for_its_key_again(store: Store) -> None:
    d = await _deployed(store, keyed())
    first, second = await store.tasks.submit(d, [{"account": "a"}, {"account": "a"}])
    (task,) = await _claim(store, d)
    await _end(store, task, "failed")
    (running,) = await _claim(store, d)
    assert running.id == second
    await store.tasks.redrive(first)
    assert (await _states(store, [first]))[0][1:] == ("waiting", "concurrency", False)
    assert await _claim(store, d) == []  # the second holds the key
    await _end(store, running)
    assert [t.id for t in await _claim(store, d)] == [first]


async def test_a_delayed_start_waits_for_its_start_once_admitted(store: Store) -> None:
    d = await _deployed(store, keyed())
    (task_id,) = await store.tasks.submit(d, [{"account": "a"}], delay=3600)
    assert await _claim(store, d) == []
    rows = await sql(store, "SELECT state, wait_reason, key_held, run_at > now() + interval"
                            " '59 minutes' FROM toolkit_tasks WHERE id = %s", task_id)  # fmt: skip
    assert rows == [("waiting", "start", True, True)]


async def test_a_key_the_input_does_not_give_is_refused_at_submit(store: Store) -> None:
    d = await _deployed(store, keyed())
    with pytest.raises(InputError, match=r"concurrency key of keyed v1: .* gives null") as info:
        await store.tasks.submit(d, [{"other": 1}])
    assert info.value.path == "$.concurrency.key"


def test_a_key_reads_only_the_input() -> None:
    text = keyed().replace("${ input.account }", "${ steps.work.id }")
    with pytest.raises(DefinitionError, match="a concurrency key is rendered at submit"):
        definition(text)


async def test_a_free_key_is_taken_at_submit_and_a_batch_tries_at_most_32(store: Store) -> None:
    """The submit admits a task whose key is free (it holds it at once, no wake row); one
    transaction tries at most 32 keys so, and the admission takes the others."""
    d = await _deployed(store, keyed())
    ids = await store.tasks.submit(d, [{"account": f"k{n}"} for n in range(40)])
    rows = await _states(store, ids)
    assert [r[1:] for r in rows] == [("queued", None, True)] * 32 + [
        ("waiting", "concurrency", False)
    ] * 8, rows
    assert await sql(store, "SELECT count(*) FROM toolkit_key_wakes") == [(8,)]
    claimed = await _claim(store, d, 40)  # the admission first, then the claim
    assert sorted(t.id for t in claimed) == ids


async def test_a_worker_is_not_idle_while_a_key_has_room_for_a_waiting_task(
    store: Store,
) -> None:
    """A key released with a task waiting for it leaves a wake the next claim consumes:
    until then `toolkit run --until-idle` must not stop (it did, with the task stranded)."""
    d = await _deployed(store, keyed())
    first, second = await store.tasks.submit(d, [{"account": "a"}] * 2)
    (claimed,) = await _claim(store, d)
    await _end(store, claimed)
    pending, _ = await store.tasks.idle_state([d.digest])
    assert pending, await _states(store, [first, second])
    assert [task.id for task in await _claim(store, d)] == [second]
    assert await store.tasks.idle_state([d.digest]) == (True, None)  # it is leased


def test_every_insert_of_keyed_tasks_admits_or_parks_them_itself() -> None:
    """The transaction-wide flag (toolkit.keys_in_statement) turns the key triggers off for
    the rest of its transaction: every statement that inserts tasks, or brings an ended one
    back, decides their keys (a debounced task has none: a definition has one or the
    other)."""
    inserts = {
        name
        for name in query_names()
        if re.search(r"INSERT\s+INTO\s+toolkit_tasks\b(?!_)", query(name), re.IGNORECASE)
    }
    assert {"submit_tasks", "start_child", "fire_schedule"} <= inserts  # not vacuous
    deciding = {name for name in inserts if "key_decided AS" in query(name)}
    assert inserts - deciding == {"submit_debounced_task"}
    assert all("keys_in_statement AS" in query(name) for name in deciding | {"redrive_task"})


async def test_a_key_another_transaction_decides_for_parks_the_new_task(
    store: Store, dsn: str
) -> None:
    """The insert admits a task only under its key's lock, taken by lock_keys before it (so
    its snapshot has every holder committed before the lock): while another transaction
    holds the lock, the new task is parked, and the admission takes it afterwards."""
    d = await _deployed(store, keyed())
    async with await psycopg.AsyncConnection.connect(dsn) as other:
        await other.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 20))",
            ("default\x1fkeyed\x1fa",),
        )
        (task_id,) = await store.tasks.submit(d, [{"account": "a"}])
        assert (await _states(store, [task_id]))[0][1:] == ("waiting", "concurrency", False)
        await other.rollback()
    assert [t.id for t in await _claim(store, d)] == [task_id]  # admitted, then claimed


async def test_a_schedules_keyed_runs_are_admitted_by_its_tick(store: Store) -> None:
    """A schedule's tick inserts its runs as a submit does: the first takes the key (its
    input's), the next waits for it in the same tenant (the schedule's)."""
    d = await _deployed(store, keyed())
    await store.schedules.create("keyed-ops", d.name, every="1h", input={"account": "a"},
                                 tenant="acme")  # fmt: skip
    first = await store.schedules.trigger("keyed-ops")
    second = await store.schedules.trigger("keyed-ops")
    assert [r[1:] for r in await _states(store, [first, second])] == [
        ("queued", None, True),
        ("waiting", "concurrency", False),
    ]
    (task,) = await _claim(store, d)
    await _end(store, task)
    assert [t.id for t in await _claim(store, d)] == [second]
