"""The store against a real PostgreSQL: claims, fencing, heartbeats, deploys, submits."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.conftest import at_schema_version
from tests.helpers.inprocess import expire_leases
from tests.helpers.processes import eventually, lock_waits
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.checkpoint import Checkpoint
from toolkit.errors import (
    DefinitionConflict,
    InputError,
    LeaseLost,
    StoreError,
    UnknownDefinition,
)
from toolkit.lifecycle import TaskState
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.migrations import migrate, schema_status
from toolkit.store.queries import query
from toolkit.store.writes import Event, EvidenceRecord, FencedWrite

pytestmark = pytest.mark.anyio

LEASE = 30.0


async def _deployed(store: Store, text: str = THREE_STEPS):
    d = definition(text)
    await store.definitions.deploy(d)
    return d


async def test_migrations_are_idempotent(store: Store) -> None:
    assert await migrate(store.db) == []
    status = await schema_status(store.db)
    assert status.pending == () and status.current == status.expected >= 1


async def test_claim_is_exclusive_under_four_concurrent_claimers(store: Store, dsn: str) -> None:
    d = await _deployed(store)
    ids = await store.tasks.submit(d, [{"n": i} for i in range(200)])
    claims: dict[str, list[int]] = {}

    async def claimer(name: str) -> None:
        async with await Store.open(dsn, pool_size=1, migrate_schema=False) as own:
            claims[name] = []
            while True:
                batch = await own.leases.claim(name, [d.digest], 7, LEASE)
                if not batch:
                    return
                claims[name].extend(t.id for t in batch)
                assert all(t.token == 1 and not t.recovered for t in batch)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(claimer, f"w{i}")
    everything = [task_id for batch in claims.values() for task_id in batch]
    assert sorted(everything) == sorted(ids)  # every task once, none twice
    assert len(set(everything)) == len(everything)


async def test_claim_only_loaded_definitions(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": 1}])
    assert await store.leases.claim("w", ["some-other-digest"], 10, LEASE) == []
    assert len(await store.leases.claim("w", [d.digest], 10, LEASE)) == 1


async def test_expired_lease_is_reclaimed_with_next_token_and_stale_write_is_refused(
    store: Store,
) -> None:
    d = await _deployed(store)
    (task_id,) = await store.tasks.submit(d, [{"n": 1}])
    (first,) = await store.leases.claim("old", [d.digest], 1, LEASE)
    assert first.token == 1
    assert await store.leases.claim("new", [d.digest], 1, LEASE) == []  # still held

    await expire_leases(store, task_id)
    (second,) = await store.leases.claim("new", [d.digest], 1, LEASE)
    assert second.token == 2 and second.recovered

    before = await store.tasks.get(task_id)
    stale = FencedWrite(
        fence=first.fence("old"),
        checkpoint={**Checkpoint.initial("second").to_json()},
        state="succeeded",
        result={"stale": True},
        evidence=[EvidenceRecord("first#1", "first", "count.work", True, "k", "completed", 1, {})],
        events=[Event("succeeded")],
    )
    with pytest.raises(LeaseLost):
        await store.leases.commit(stale)
    after = await store.tasks.get(task_id)
    assert after == before  # nothing changed
    assert await store.tasks.evidence(task_id) == []
    assert [e["kind"] for e in await store.tasks.events(task_id)] == [
        "submitted",
        "claimed",
        "recovered",
    ]
    # The same write under the current token applies.
    await store.leases.commit(dataclasses.replace(stale, fence=second.fence("new")))
    assert (await store.tasks.get(task_id)).state == "succeeded"


async def test_write_after_expiry_is_refused_even_without_a_new_claim(store: Store) -> None:
    d = await _deployed(store)
    (task_id,) = await store.tasks.submit(d, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, LEASE)
    await expire_leases(store, task_id)
    with pytest.raises(LeaseLost):
        await store.leases.commit(FencedWrite(task.fence("w"), task.checkpoint))


async def test_heartbeat_renews_held_leases_by_task_and_token(store: Store) -> None:
    d = await _deployed(store)
    ids = await store.tasks.submit(d, [{"n": i} for i in range(3)])
    claimed = await store.leases.claim("w", [d.digest], 3, 5.0)
    held = [t.fence("w") for t in claimed]
    assert (await store.leases.renew("w", "i1", held, 60.0)).renewed == {i: None for i in ids}
    # A wrong token, another owner, or an expired lease is not renewed.
    await expire_leases(store, ids[0])
    wrong = dataclasses.replace(held[1], token=held[1].token + 1)
    renewed = await store.leases.renew("w", "i1", [held[0], wrong, held[2]], 60.0)
    assert renewed.renewed == {ids[2]: None}
    assert (await store.leases.renew("someone-else", "i1", held, 60.0)).renewed == {}


async def test_a_heartbeat_racing_the_last_write_reports_that_lease_ended_not_lost(
    store: Store,
) -> None:
    """Regression: a renewal that waited for the row lock while the cycle's final write
    committed found the lease gone and reported it lost (a spurious warning, and a cycle
    cancelled after it had finished). The task's token is still the lease's and it is no
    longer leased: its own write ended the lease."""
    d = await _deployed(store)
    ids = await store.tasks.submit(d, [{"n": 1}, {"n": 2}])
    first, second = await store.leases.claim("w", [d.digest], 2, LEASE)
    await store.leases.commit(
        FencedWrite(first.fence("w"), first.checkpoint, state=TaskState.SUCCEEDED, result={})
    )
    await expire_leases(store, second.id)
    (third,) = await store.leases.claim("other", [d.digest], 1, LEASE)  # taken over
    renewal = await store.leases.renew("w", "i1", [first.fence("w"), second.fence("w")], 60.0)
    assert (renewal.renewed, renewal.ended) == ({}, frozenset({ids[0]}))
    assert third.id == ids[1]  # the task taken over is lost, not ended


async def test_deploy_same_digest_is_noop_and_changed_digest_is_refused(store: Store) -> None:
    d = definition(THREE_STEPS)
    assert await store.definitions.deploy(d) == "registered"
    assert await store.definitions.deploy(d) == "unchanged"
    changed = definition(THREE_STEPS.replace("succeed: {output: zero}", "succeed: {output: nil}"))
    with pytest.raises(DefinitionConflict, match="steps changed: zero"):
        await store.definitions.deploy(changed)
    assert (await store.definitions.get("three-steps")).digest == d.digest
    with pytest.raises(UnknownDefinition):
        await store.definitions.get("three-steps", 2)


@pytest.mark.one_postgresql  # (the lock wait is watched on this server)
async def test_a_registration_waiting_on_another_changes_nothing_on_any_unique_key(
    store: Store, dsn: str
) -> None:
    """Regression: three workers started at once with the same new version; one exited with
    "duplicate key value violates unique constraint toolkit_definitions_digest_key". Its
    insert had passed the (name, version) check before another's row existed, then met that
    row in the digest's unique index once the other committed. The statement now treats a
    conflict on any unique key as "registered meanwhile". (The interleaving is forced here
    with a row that shares the digest alone: an insert waits on it in the digest's index.)"""
    d = definition(THREE_STEPS)
    params = {"name": d.name, "version": d.version, "digest": d.digest,
              "body": Jsonb(d.body), "source": None}  # fmt: skip
    inserted: list[object] = []

    async def second() -> None:
        async with store.db.connection() as conn:
            cursor = await conn.execute(query("insert_definition"), params)
            inserted.append(await cursor.fetchone())

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            async with store.db.transaction() as first:
                await first.execute(query("insert_definition"), {**params, "name": "other"})
                tg.start_soon(second)
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe:
                    await eventually(lambda: _waits(probe), what="the second insert to wait")
    assert inserted == [None]


async def _waits(conn: psycopg.AsyncConnection[Any]) -> bool:
    return await lock_waits(conn) > 0


async def test_submit_validates_input_before_writing(store: Store) -> None:
    d = await _deployed(
        store, THREE_STEPS.replace("input: {type: object}", "input: {type: object, required: [n]}")
    )
    with pytest.raises(InputError):
        await store.tasks.submit(d, [{"n": 1}, {"m": 2}])
    assert await store.tasks.counts_by_state() == {}


async def test_one_input_given_as_inputs_is_refused(store: Store) -> None:
    """Regression: a dict given as ``inputs`` made a task per key, a string one per
    character, silently (a definition without an input schema took them)."""
    d = await _deployed(store)
    for one in ({"n": 1, "m": 2}, "ab", b"ab"):
        with pytest.raises(InputError, match=r"inputs must be a list of task inputs.*\[value\]"):
            await store.tasks.submit(d, one)  # type: ignore[arg-type]
    assert await store.tasks.counts_by_state() == {}
    assert len(await store.tasks.submit(d, ({"n": n} for n in range(2)))) == 2  # type: ignore[arg-type]


async def test_unreachable_database_is_one_clear_error() -> None:
    from toolkit.errors import DatabaseUnavailable

    with pytest.raises(DatabaseUnavailable, match=r"cannot reach PostgreSQL at .*port=1") as info:
        await Database.connect("postgresql://u:secret@127.0.0.1:1/x", timeout=2)
    assert "secret" not in str(info.value)


async def test_a_rolled_back_transaction_is_a_retryable_error_not_a_refusal(store: Store) -> None:
    """Regression: a deadlock was a StoreError, which fails the task for good."""
    from toolkit.errors import DatabaseUnavailable

    with pytest.raises(DatabaseUnavailable, match=r"rolled the transaction back \(40P01\)"):
        async with store.db.connection() as conn:
            await conn.execute(
                "DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = 'deadlock_detected'; END $$"
            )


async def test_a_migration_that_waits_past_its_lock_timeout_is_named_and_rolled_back(
    empty_dsn: str,
) -> None:
    """Migration 0037 locks toolkit_tasks while workers run: behind a transaction that
    holds the table (a long export, say) it gives up after its lock timeout rather than hold
    the fleet's writes queued behind it; the error names it, nothing of it stays, and
    migrating again applies it."""
    at_schema_version(empty_dsn, 36)
    db = await Database.connect(empty_dsn, min_size=1, max_size=2)
    try:
        with psycopg.connect(empty_dsn) as reader:  # a transaction that reads the tasks
            reader.execute("SELECT count(*) FROM toolkit_tasks").fetchone()
            with pytest.raises(StoreError) as refused:
                await migrate(db)
        message = str(refused.value)
        assert "0037_no_foreign_keys_to_tasks" in message and "55P03" in message, message
        assert "toolkit db migrate" in message, message
        status = await schema_status(db)
        assert status.current == 36, status
        applied = await migrate(db)
        assert [m.version for m in applied] == [37], applied
    finally:
        await db.close()
