"""The tenant rotation's marks, made by the statements that make tasks due (issue 25;
migration 0030).

A tenant out of the rotation (not ready) is claimed again once its next_due comes; every
statement that inserts a live task or makes one due sooner lowers next_due to it itself (the
``due_marks`` fragment), as a distributed store with no triggers needs. The two triggers that
did it stay for the previous release's workers and leave alone a transaction whose statement
says it does the work. Each test runs with the triggers kept and dropped (the ``marking``
fixture); after every test of the ``store`` fixture, no live task is left due before its
tenant's next_due (tests/helpers/tenants.py).
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers.citus import on_citus, skip_kept_triggers
from tests.helpers.processes import eventually
from tests.helpers.tenants import tasks_missed_by_the_rotation
from tests.helpers.triggers import ROTATION_TRIGGERS, drop_triggers
from tests.helpers.workflows import THREE_STEPS, definition
from tests.store.test_concurrency_keys import keyed
from toolkit.checkpoint import Checkpoint
from toolkit.definition import WorkflowDefinition
from toolkit.errors import InputError
from toolkit.store import Store, rotation
from toolkit.store.key_locks import no_locked_keys
from toolkit.store.leases import ClaimedTask
from toolkit.store.queries import query, query_names
from toolkit.store.writes import NEVER, FencedWrite

pytestmark = pytest.mark.anyio

LEASE = 30.0


async def _deployed(store: Store, text: str = THREE_STEPS) -> WorkflowDefinition:
    d = definition(text)
    await store.definitions.deploy(d)
    return d


async def _demote(store: Store, tenant: str) -> None:
    """Take ``tenant`` out of the rotation as a claim that found it dry would: next_due is
    the first due time of its live tasks (none: null)."""
    async with store.db.connection() as conn:
        await conn.execute(
            "UPDATE toolkit_tenants SET ready = false, next_due = ("
            "  SELECT min(CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END)"
            "  FROM toolkit_tasks"
            "  WHERE tenant = %(t)s AND state IN ('queued', 'leased', 'waiting'))"
            " WHERE tenant = %(t)s",
            {"t": tenant},
        )
    assert await tasks_missed_by_the_rotation(store) == []


async def _next_due_has_come(store: Store, tenant: str) -> None:
    """The tenant is back in the rotation at its next claim: its next_due is now or past."""
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT ready, next_due <= statement_timestamp() FROM toolkit_tenants"
            " WHERE tenant = %s",
            (tenant,),
        )
        row = await cursor.fetchone()
    assert row is not None and (row[0] or row[1]), (tenant, row)
    assert await tasks_missed_by_the_rotation(store) == []


async def _claim_one(store: Store, d: WorkflowDefinition) -> ClaimedTask:
    (task,) = await store.leases.claim("w", [d.digest], 1, LEASE)
    return task


async def test_a_submit_to_a_tenant_out_of_the_rotation_lowers_its_next_due(
    marking: Store,
) -> None:
    store = marking
    d = await _deployed(store)
    await store.tenants.set("t")
    await _demote(store, "t")
    (task_id,) = await store.tasks.submit(d, [{}], tenant="t", delay=3600)
    await store.tasks.submit_keyed(d, {}, key="k", tenant="t", delay=7200)
    task = await store.tasks.get(task_id)
    missed = await tasks_missed_by_the_rotation(store)
    assert missed == [], (task, missed)


async def test_a_timer_shorter_than_the_lease_lowers_next_due(marking: Store) -> None:
    store = marking
    d = await _deployed(store)
    await store.tasks.submit(d, [{}], tenant="t")
    task = await _claim_one(store, d)
    await _demote(store, "t")  # its one task leased: next_due is the lease's expiry
    write = FencedWrite(task.fence("w"), task.checkpoint, state="waiting", wait_reason="timer",
                        delay_seconds=0.0)  # fmt: skip
    assert await store.leases.commit_many([write]) == {task.id: "waiting"}
    await _next_due_has_come(store, "t")


async def test_a_signal_that_wakes_a_task_lowers_next_due(marking: Store) -> None:
    store = marking
    d = await _deployed(store)
    await store.tasks.submit(d, [{}], tenant="t")
    task = await _claim_one(store, d)
    checkpoint = {**task.checkpoint, "wait": {"signal": "go"}}
    write = FencedWrite(task.fence("w"), checkpoint, state="waiting", wait_reason="signal",
                        run_at=NEVER)  # fmt: skip
    assert await store.leases.commit_many([write]) == {task.id: "waiting"}
    await _demote(store, "t")
    await store.tasks.signal(task.id, "go", force=True)
    await _next_due_has_come(store, "t")


async def test_a_redrive_lowers_next_due(marking: Store) -> None:
    store = marking
    d = await _deployed(store)
    await store.tasks.submit(d, [{}], tenant="t")
    task = await _claim_one(store, d)
    write = FencedWrite(task.fence("w"), task.checkpoint, state="failed",
                        error={"name": "X", "message": "boom", "step": "a"})  # fmt: skip
    assert await store.leases.commit_many([write]) == {task.id: "failed"}
    await _demote(store, "t")  # no live task: next_due null
    await store.tasks.redrive(task.id)
    await _next_due_has_come(store, "t")


async def test_a_key_admission_lowers_next_due(marking: Store) -> None:
    store = marking
    d = await _deployed(store, keyed())
    first, parked = await store.tasks.submit(d, [{"account": "a"}] * 2, tenant="t")
    task = await _claim_one(store, d)
    assert task.id == first
    write = FencedWrite(task.fence("w"), task.checkpoint, state="failed",
                        error={"name": "X", "message": "boom", "step": "work"})  # fmt: skip
    assert await store.leases.commit_many([write]) == {first: "failed"}
    await _demote(store, "t")  # only the parked task, due never
    assert await store.leases.admit_keys() == 1
    assert (await store.tasks.get(parked)).state == "queued"
    await _next_due_has_come(store, "t")


# --- the races of docs/decisions.md ---------------------------------------------------------

#: A task row as the previous release's submit wrote it, its marks left to the trigger.
_PREVIOUS_RELEASE_INSERT = (
    "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
    " definition_digest, input, checkpoint) VALUES ('racing', %s, %s, %s, '{}', %s)"
    " RETURNING id"
)


@pytest.fixture(
    params=["previous release's insert", "statement, triggers kept", "statement, triggers dropped"]
)
async def racing(request: pytest.FixtureRequest, store: Store) -> str:
    """How the racing task is inserted: as the previous release did, relying on the trigger,
    or by this release's statement, with the triggers kept or dropped."""
    skip_kept_triggers(request.config, request.param != "statement, triggers dropped")
    if request.param == "statement, triggers dropped" and not on_citus(request.config):
        await drop_triggers(store, ROTATION_TRIGGERS)
    return str(request.param)


async def _submit_in(conn: psycopg.AsyncConnection[Any], d: WorkflowDefinition, how: str) -> int:
    """One task of tenant racing inserted ``how``, in ``conn``'s transaction."""
    checkpoint = Jsonb(Checkpoint.initial(d.start).to_json())
    if how == "previous release's insert":
        cursor = await conn.execute(
            _PREVIOUS_RELEASE_INSERT, (d.name, d.version, d.digest, checkpoint)
        )
    else:
        cursor = await conn.execute(
            query("submit_tasks"),
            {
                "tenant": "racing", "name": d.name, "version": d.version, "digest": d.digest,
                "inputs": Jsonb([{}]), "tags": Jsonb([{}]), "checkpoint": checkpoint,
                "timeout": None, "priority": 0, "concurrency_keys": Jsonb([None]),
                "concurrency_limit": None, "trace_parent": None, "run_at": None,
                "delay": None, **no_locked_keys(),
            },
        )  # fmt: skip
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_submit_in_flight_keeps_its_tenant_from_being_demoted(
    store: Store, dsn: str, racing: str
) -> None:
    """The demotion's snapshot cannot see a task of a transaction not yet committed: the
    insert's KEY SHARE on the tenant row makes the demotion skip that tenant; without it the
    task would be hidden from every claim."""
    d = await _deployed(store)
    await store.tenants.set("racing")  # ready, nothing queued: a claim finds it dry
    async with await psycopg.AsyncConnection.connect(dsn) as submitter:
        task_id = await _submit_in(submitter, d, racing)
        await rotation.Rotation(store.db).settle([], ["racing"], False)  # demotion, meanwhile
        async with store.db.connection() as conn:
            cursor = await conn.execute("SELECT ready FROM toolkit_tenants WHERE tenant = 'racing'")
            assert await cursor.fetchone() == (True,)
        await submitter.commit()
    assert [t.id for t in await store.leases.claim("w", [d.digest], 8, LEASE)] == [task_id]


@pytest.mark.one_postgresql  # ordered by the server's lock waits, which a cluster's nodes hold
async def test_a_submit_after_the_demotions_lock_lowers_next_due_itself(
    store: Store, dsn: str, racing: str
) -> None:
    """The demotion locked the tenant first: the insert's lock waits for it to commit, then
    reads the tenant's row as the demotion left it, not ready, and lowers next_due."""
    d = await _deployed(store)
    await store.tenants.set("racing")
    inserted: list[int] = []
    async with await psycopg.AsyncConnection.connect(dsn) as demoter:
        demoted = await demoter.execute(query("demote_dry_tenants"), {"tenants": ["racing"]})
        assert await demoted.fetchall() == [(1,)]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as submitter:
            pid = submitter.info.backend_pid

            async def submit() -> None:
                inserted.append(await _submit_in(submitter, d, racing))

            async def blocked() -> bool:
                async with store.db.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        (pid,),
                    )
                    row = await cursor.fetchone()
                return bool(row and row[0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                await eventually(blocked, timeout=15, what="the submit to wait for the lock")
                await demoter.commit()
    (task_id,) = inserted
    task = await store.tasks.get(task_id)
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT ready, next_due FROM toolkit_tenants WHERE tenant = 'racing'"
        )
        state = await cursor.fetchone()
    assert state == (False, task.run_at), (state, task)
    assert [t.id for t in await store.leases.claim("w", [d.digest], 8, LEASE)] == [task_id]


async def test_a_submit_registers_a_new_tenant_by_a_statement_of_its_own(store: Store) -> None:
    """A tenant row committed by another transaction while a submit's statement runs is not
    in that statement's snapshot, so the marks could not see it: the first submit of a
    tenant registers it before (toolkit/store/submission.py register_tenant)."""
    d = await _deployed(store)
    assert "fresh" not in store.db.registered_tenants
    await store.tasks.submit(d, [{}], tenant="fresh")
    assert "fresh" in store.db.registered_tenants
    async with store.db.connection() as conn:
        cursor = await conn.execute("SELECT count(*) FROM toolkit_tenants WHERE tenant = 'fresh'")
        assert await cursor.fetchone() == (1,)


async def test_a_refused_submit_registers_no_tenant(store: Store) -> None:
    """The registration comes after every check of the submit: a refused one writes nothing
    (a stray tenant would also turn off the claim's one-tenant path for good)."""
    d = await _deployed(store)
    with pytest.raises(InputError, match="priority"):
        await store.tasks.submit(d, [{}], tenant="typo", priority=42)
    with pytest.raises(InputError, match="tag"):
        await store.tasks.submit_keyed(d, {}, key="k", tenant="typo-2", tags={"": "x"})
    async with store.db.connection() as conn:
        cursor = await conn.execute("SELECT tenant FROM toolkit_tenants ORDER BY tenant")
        assert await cursor.fetchall() == []


EMITTED = """
name: emitted
version: 1
input: {type: object}
triggers:
  - event: order.placed
    key: "${ event.order_id }"
start: a
steps:
  a: {effect: count.work, idempotent: true}
"""

DEBOUNCED = """
name: debounced
version: 1
input: {type: object}
debounce: {key: "${ input.account }", quiet: 1h}
start: a
steps:
  a: {effect: count.work, idempotent: true}
"""


async def test_an_emit_or_a_debounced_submit_registers_on_the_connection_it_holds(
    dsn: str,
) -> None:
    """Both insert on a connection they hold (an emit inside its transaction): the tenant is
    registered there, so one pooled connection is enough, and a registration inside a
    transaction is not remembered (it could be rolled back)."""
    store = await Store.open(dsn, pool_size=1, migrate_schema=False)
    try:
        for text in (EMITTED, DEBOUNCED):
            await store.definitions.deploy(definition(text))
        with anyio.fail_after(8):  # a second connection would wait 10 s for the pool
            emitted = await store.events.emit("order.placed", {"order_id": "o1"}, tenant="e")
            assert len(emitted.started) == 1, emitted
            assert "e" not in store.db.registered_tenants
            await store.tasks.submit(definition(DEBOUNCED), [{"account": "a"}], tenant="d")
            assert "d" in store.db.registered_tenants
    finally:
        await store.close()


# --- which statements make the marks ---------------------------------------------------------

_INSERTS_TASKS = re.compile(r"INSERT\s+INTO\s+toolkit_tasks\b(?!_)", re.IGNORECASE)
_TASK_UPDATE_SET = re.compile(
    r"UPDATE\s+toolkit_tasks\b(?!_)[^;]*?\bSET\b(?P<set>.*?)(?:\bFROM\b|\bWHERE\b|\bRETURNING\b)",
    re.IGNORECASE | re.DOTALL,
)
_SETS_DUE = re.compile(r"(?<![\w.])(?:state|run_at|lease_expires_at)\s*=", re.IGNORECASE)

#: Statements that move a task's due time but never sooner: a claim takes due tasks and
#: leases them until later; a renewal extends a lease; commit_step applies only writes that
#: keep their lease or end their task (its one caller sends no other: Leases.commit_many's
#: _lean), and a leased task is due at its lease's expiry, which such a write leaves as it is.
NEVER_SOONER = {
    "claim_tasks", "claim_tasks_one_tenant", "claim_tenant_tasks", "renew_leases",
    "renew_tenant_leases", "commit_step",
}


def due_statements(statements: dict[str, str]) -> set[str]:
    """The statements that insert tasks or set a task's state, run_at or lease expiry."""
    found = set()
    for name, text in statements.items():
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        if _INSERTS_TASKS.search(code) or any(
            _SETS_DUE.search(m.group("set")) for m in _TASK_UPDATE_SET.finditer(code)
        ):
            found.add(name)
    return found


def test_every_statement_that_makes_tasks_due_marks_the_rotation() -> None:
    """The transaction-wide flag (toolkit.due_in_statement) turns the triggers off for the
    rest of its transaction: every statement that can make a task due sooner marks."""
    statements = {name: query(name) for name in query_names()}
    due = due_statements(statements)
    assert {"submit_tasks", "commit_fenced", "send_signal", "redrive_task"} <= due  # not vacuous
    assert NEVER_SOONER <= due
    missing = sorted(
        name
        for name in due - NEVER_SOONER
        if "due_in_statement AS" not in statements[name] or "due_marked AS" not in statements[name]
    )
    assert missing == []


async def test_the_key_admission_marks_the_rotation_itself(store: Store) -> None:
    """Migration 0030 edits toolkit_admit_keys in place: it says so, and marks."""
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'toolkit_admit_keys'"
        )
        row = await cursor.fetchone()
    assert row is not None
    assert "toolkit.due_in_statement" in row[0] and "next_due = least(" in row[0], row[0]
