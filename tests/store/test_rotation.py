"""The tenant rotation (issue 20, migration 0020): a claim reads only the tenants it picks,
promotes those whose next due time came, demotes those it found dry, and never hides a task
from the claim (docs/decisions.md, "The fair claim at any number of tenants"). A submit that
races the demotion: tests/store/test_due_marks.py."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.conftest import at_schema_version
from tests.helpers.processes import eventually
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.checkpoint import Checkpoint
from toolkit.definition import WorkflowDefinition
from toolkit.store import Store, rotation
from toolkit.store.leases import ClaimedTask
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio

LEASE = 30.0


async def _deployed(store: Store) -> WorkflowDefinition:
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    return d


async def _tenant(store: Store, tenant: str) -> dict[str, Any]:
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT ready, vtime, next_due FROM toolkit_tenants WHERE tenant = %s", (tenant,)
        )
        row = await cursor.fetchone()
    assert row is not None, tenant
    return {"ready": row[0], "vtime": row[1], "next_due": row[2]}


async def _finish(store: Store, tasks: list[ClaimedTask]) -> None:
    for task in tasks:
        write = FencedWrite(task.fence("w"), {"cursor": None}, state="succeeded", result={})
        assert await store.leases.commit(write) == "succeeded"


# a write by hand keeps the rotation's marks by a trigger of one PostgreSQL's
@pytest.mark.one_postgresql
async def test_a_dry_tenant_leaves_the_rotation_until_its_task_is_due(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{}], tenant="now")
    (later,) = await store.tasks.submit(d, [{}], tenant="later", delay=3600)
    batch = await store.leases.claim("w", [d.digest], 8, LEASE)
    assert [t.tenant for t in batch] == ["now"]
    parked = await _tenant(store, "later")
    task = await store.tasks.get(later)
    assert not parked["ready"] and parked["next_due"] == task.run_at, (parked, task)
    # Made due sooner by any write (here: by hand), the task's tenant is due again at once.
    async with store.db.connection() as conn:
        await conn.execute(
            "UPDATE toolkit_tasks SET run_at = statement_timestamp() - interval '1 second'"
            " WHERE id = %s",
            (later,),
        )
    assert (await _tenant(store, "later"))["next_due"] < task.run_at
    assert [t.id for t in await store.leases.claim("w", [d.digest], 8, LEASE)] == [later]
    assert (await _tenant(store, "later"))["ready"]  # promoted by that claim


async def test_a_task_due_by_the_clock_alone_is_claimed(store: Store) -> None:
    """No write makes it due: the promotion reads the tenants whose next_due has come."""
    d = await _deployed(store)
    (task_id,) = await store.tasks.submit(d, [{}], tenant="timer", delay=0.5)
    assert await store.leases.claim("w", [d.digest], 8, LEASE) == []
    assert not (await _tenant(store, "timer"))["ready"]

    async def claimed() -> bool:
        return [t.id for t in await store.leases.claim("w", [d.digest], 8, LEASE)] == [task_id]

    await eventually(claimed, timeout=15, what=f"task {task_id} claimed once due")


async def test_a_tenant_with_work_for_other_workers_stays_ready_and_moves_on(
    store: Store,
) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{}], tenant="other")
    before = await _tenant(store, "other")
    assert await store.leases.claim("w", ["not-this-definition"], 8, LEASE) == []
    after = await _tenant(store, "other")
    assert after["ready"] and after["vtime"] == before["vtime"] + 1, (before, after)
    assert len(await store.leases.claim("w", [d.digest], 8, LEASE)) == 1


async def test_a_tenant_joins_the_rotation_at_the_lowest_vtime(marking: Store) -> None:
    """No credit for time away: a new, promoted or resumed tenant starts where the ready
    tenant furthest behind is, not at zero (the statements that put it there read that
    floor themselves: migration 0030)."""
    store = marking
    await store.tenants.set("a")
    await store.tenants.set("b")
    async with store.db.connection() as conn:
        await conn.execute("UPDATE toolkit_tenants SET vtime = 40 WHERE tenant = 'a'")
        await conn.execute("UPDATE toolkit_tenants SET vtime = 50 WHERE tenant = 'b'")
    await store.tenants.set("new")
    assert (await _tenant(store, "new"))["vtime"] == 40
    await store.tenants.set("b", paused=True)
    async with store.db.connection() as conn:
        await conn.execute("UPDATE toolkit_tenants SET vtime = 0 WHERE tenant = 'b'")
        await conn.execute("UPDATE toolkit_tenants SET vtime = 45 WHERE tenant = 'a'")
    await store.tenants.set("b", paused=False)
    assert (await _tenant(store, "b"))["vtime"] == 40  # the lowest of "new" (40) and "a" (45)
    d = await _deployed(store)
    await store.tasks.submit(d, [{}], tenant="submitted")  # registered by its first submit
    assert (await _tenant(store, "submitted"))["vtime"] == 40
    async with store.db.connection() as conn:  # out of the rotation, its task due now
        await conn.execute(
            "UPDATE toolkit_tenants SET ready = false, vtime = 0, next_due = now()"
            " WHERE tenant = 'submitted'"
        )
    await store.leases.claim("w", [d.digest], 8, LEASE)  # promotes it
    assert (await _tenant(store, "submitted"))["vtime"] >= 40


async def test_every_tenant_starts_soon_with_many_more_tenants_than_a_window(
    store: Store,
) -> None:
    """300 tenants with 3 tasks each and a hot one with 3,000, claims of 16 (a window of 32
    tenants): every tenant's first task starts within the first 300 / 16 claims and a few
    more, and the hot tenant gets no more than its share meanwhile."""
    d = await _deployed(store)
    await store.tasks.submit(d, [{}] * 3000, tenant="hot")
    for n in range(300):
        await store.tasks.submit(d, [{}] * 3, tenant=f"t{n:03}")
    started: set[str] = set()
    got: Counter[str] = Counter()
    claims = 0
    while len(started) < 301:
        batch = await store.leases.claim("w", [d.digest], 16, LEASE)
        claims += 1
        waiting = sorted({f"t{n:03}" for n in range(300)} - started)
        assert batch, f"nothing claimed; not started: {waiting[:10]}"
        started |= {t.tenant for t in batch}
        got.update(t.tenant for t in batch)
        await _finish(store, batch)
        assert claims <= 300 // 16 + 4, (claims, len(started), got.most_common(3))
    assert got["hot"] <= claims, got["hot"]  # about one task per claim, as any other tenant


async def test_a_tenant_row_held_elsewhere_is_moved_on_by_a_later_claim(
    store: Store, dsn: str
) -> None:
    """The advance waits for no lock: a tenant row another statement holds is skipped, and
    what it is owed is added by the claimer's next settle."""
    await store.tenants.set("held")
    before = (await _tenant(store, "held"))["vtime"]
    turn = rotation.Rotation(store.db)
    async with await psycopg.AsyncConnection.connect(dsn) as other:
        await other.execute("SELECT 1 FROM toolkit_tenants WHERE tenant = 'held' FOR UPDATE")
        with anyio.fail_after(10):  # it must not wait for the lock
            await turn.settle(["held", "held"], [], True)
        assert (await _tenant(store, "held"))["vtime"] == before
    await turn.settle([], [], True)
    assert (await _tenant(store, "held"))["vtime"] == before + 2


async def test_tasks_queued_before_the_upgrade_are_claimed_after_it(empty_dsn: str) -> None:
    """Migration 0020 on a store in use: tenants without live tasks leave the rotation, the
    others stay in it, and every task queued or parked before is claimed when due."""
    d = definition(THREE_STEPS)
    at_schema_version(empty_dsn, 19)
    checkpoint = Jsonb(Checkpoint.initial(d.start).to_json())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO toolkit_tenants (tenant) VALUES ('busy'), ('parked'), ('idle')")
        conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint, run_at)"
            " VALUES ('busy', %s, %s, %s, '{}', %s, now()),"
            " ('parked', %s, %s, %s, '{}', %s, now() + interval '1 hour')",
            (d.name, d.version, d.digest, checkpoint) * 2,
        )
    async with await Store.open(empty_dsn) as store:  # migrates
        await store.definitions.deploy(d)
        assert [(await _tenant(store, t))["ready"] for t in ("busy", "parked", "idle")] == [
            True, True, False,
        ]  # fmt: skip
        batch = await store.leases.claim("w", [d.digest], 8, LEASE)
        assert [t.tenant for t in batch] == ["busy"]
        parked = await _tenant(store, "parked")
        assert not parked["ready"] and parked["next_due"] is not None, parked


async def test_a_settle_during_an_outage_warns_nothing_and_keeps_what_is_owed(
    store: Store, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The outage is the supervisor's one warning (a failed stop's CI run counted two: the
    rotation's and the outage's); the served tenants' advance waits for a later settle."""
    await store.tenants.set("served")
    before = (await _tenant(store, "served"))["vtime"]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    turn = rotation.Rotation(store.db)
    with caplog.at_level(logging.DEBUG, logger="toolkit.store.rotation"):
        await turn.settle(["served", "served"], [], True)
    failed = [r for r in caplog.records if getattr(r, "action", None) == "rotation_failed"]
    assert [r.levelno for r in failed] == [logging.DEBUG], caplog.text
    await eventually(lambda: _advanced(turn, store, "served", before + 2), what="the owed advance")


async def _advanced(turn: rotation.Rotation, store: Store, tenant: str, vtime: float) -> bool:
    await turn.settle([], [], True)
    return bool((await _tenant(store, tenant))["vtime"] == vtime)


async def test_the_demotion_decides_due_now_and_next_due_at_one_instant(store: Store) -> None:
    """Regression (migration 0023): the demotion read the clock once for "due now" and once
    for "the next due time"; a task due between the two readings was neither, its tenant
    left the rotation past it, and no claim took it again (a drain spun until its deadline
    in CI). The race is one of milliseconds on a loaded server: the function is checked to
    read one instant (since migration 0028, the statement's: every reading is the same)."""
    async with store.db.connection() as conn:
        row = await (
            await conn.execute("SELECT pg_get_functiondef('toolkit_demote_tenants'::regproc)")
        ).fetchone()
    assert row is not None
    assert "clock_timestamp" not in row[0], row[0]
    assert row[0].count("statement_timestamp()") == 1, row[0]
