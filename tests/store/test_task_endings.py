"""What a task's end does, done by the statement that ends it (issue 25; migration 0029).

The fenced write and the cancel release a concurrency key, return reservations, count a
scheduled run's outcome and announce an awaited task's end themselves (a cancel's return of
a reservation: tests/store/test_budgets.py, with the same fixture) (the ``task_ended``
fragment), as a distributed store with no triggers needs. The four triggers that did it stay
for the previous release's workers during an upgrade, and leave alone a transaction whose
statement says it does the work (docs/scaling.md, docs/decisions.md).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.helpers.inprocess import set_tenant_budget, sql, tenant_use
from tests.helpers.workflows import RESERVE, definition
from tests.store.test_concurrency_keys import keyed
from tests.store.test_schedules import FAILING
from toolkit.store import Store
from toolkit.store.budgets import Budgets
from toolkit.store.leases import ClaimedTask
from toolkit.store.queries import _expanded, query, query_names
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio

async def _fail(store: Store, tasks: list[ClaimedTask], worker: str = "w") -> None:
    writes = [
        FencedWrite(task.fence(worker), task.checkpoint, state="failed",
                    error={"name": "X", "step": "boom"})
        for task in tasks
    ]  # fmt: skip
    applied = await store.leases.commit_many(writes)
    assert set(applied) == {task.id for task in tasks}


async def test_a_key_holders_end_lets_the_next_task_of_its_key_in(ending: Store) -> None:
    store = ending
    d = definition(keyed())
    await store.definitions.deploy(d)
    first, second = await store.tasks.submit(d, [{"account": "a"}] * 2)
    (task,) = await store.leases.claim("w", [d.digest], 10, 30.0)
    assert task.id == first
    await _fail(store, [task])
    (task,) = await store.leases.claim("w", [d.digest], 10, 30.0)
    assert task.id == second


async def test_a_failed_write_mid_step_returns_the_reservation_it_holds(ending: Store) -> None:
    store = ending
    await set_tenant_budget(store, "acme", 1000)
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{"items": [1]}], tenant="acme")
    (task,) = await store.leases.claim("w", [d.digest], 1, 60)
    fanout = {"occurrence": "fan#1", "branches": {}, "winner": None,
              "reserved": {"tokens": 100}, "spent": {"tokens": 30}}  # fmt: skip
    checkpoint = {**task.checkpoint, "fanout": fanout}
    await Budgets(store.db).reserve(task.fence("w"), {"tokens": 100}, checkpoint,
                                    f"{task.token}:1", {})  # fmt: skip
    write = FencedWrite(task.fence("w"), checkpoint, state="failed",
                        error={"name": "X", "step": "fan"}, budget_delta={"tokens": 5})  # fmt: skip
    assert await store.leases.commit(write) == "failed"
    assert await tenant_use(store, "acme") == (35, 0)


async def test_runs_of_a_schedule_that_end_together_count_in_id_order(ending: Store) -> None:
    """Five runs end in one group commit: fail, fail, success, fail, fail. With a limit of 2
    the second failure pauses the schedule; the count left is the last streak, 2."""
    store = ending
    d = definition(FAILING)
    await store.definitions.deploy(d)
    await store.schedules.create("flaky", "failing", every="1h", pause_after_failures=2)
    ids = await store.tasks.submit(d, [{}] * 5)
    await sql(store, "UPDATE toolkit_tasks SET schedule_name = 'flaky' WHERE id = ANY(%s)", ids)
    tasks = sorted(await store.leases.claim("w", [d.digest], 5, 30.0), key=lambda t: t.id)
    outcomes = ["failed", "failed", "succeeded", "failed", "failed"]
    writes = [
        FencedWrite(task.fence("w"), task.checkpoint, state=state,
                    **({"result": {}} if state == "succeeded"
                       else {"error": {"name": "X", "step": "boom"}}))
        for task, state in zip(tasks, outcomes, strict=True)
    ]  # fmt: skip
    assert len(await store.leases.commit_many(writes)) == 5
    schedule = await store.schedules.get("flaky")
    assert schedule.paused and schedule.consecutive_failures == 2, schedule
    assert schedule.pause_note == (
        f"paused after 2 consecutive failures (the last: task {tasks[1].id})"
    )


async def test_an_awaited_tasks_cancel_is_announced(ending: Store, dsn: str) -> None:
    store = ending
    d = definition(FAILING)
    await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(d, [{}])
    await sql(store, "UPDATE toolkit_tasks SET awaited = true WHERE id = %s", task_id)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN toolkit_task_ended")
        assert await store.tasks.cancel(task_id) == "cancelled"
        heard = [n.payload async for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert heard == [str(task_id)]


async def _key_wakes(store: Store) -> list[tuple[Any, ...]]:
    return await sql(store, "SELECT concurrency_key FROM toolkit_key_wakes ORDER BY id")


# the previous release's triggers, which the distribution drops
@pytest.mark.one_postgresql
async def test_the_previous_releases_statements_still_get_the_triggers_work(
    store: Store,
) -> None:
    """An ending UPDATE that does not say it does the work (as the previous release's) gets
    it from the trigger; one that says so, inside its transaction, does not."""
    d = definition(keyed())
    await store.definitions.deploy(d)
    ids = await store.tasks.submit(d, [{"account": "a"}, {"account": "b"}])
    await sql(store, "DELETE FROM toolkit_key_wakes")
    end = "UPDATE toolkit_tasks SET state = 'failed' WHERE id = %s"
    await sql(store, end, ids[0])
    assert await _key_wakes(store) == [("a",)]
    async with store.db.transaction() as conn:
        await conn.execute("SELECT set_config('toolkit.ends_in_statement', 'on', true)")
        await conn.execute(end, (ids[1],))
    assert await _key_wakes(store) == [("a",)]


def test_a_fragment_includes_others_and_never_itself() -> None:
    """The ending statements include task_ended inside cancel_targets (queries.py)."""
    fragments = {"outer": "a,\n-- include: inner\n", "inner": "b", "loop": "-- include: loop"}
    assert _expanded("s", "-- include: outer", fragments) == "a,\nb\n"
    with pytest.raises(ValueError, match="'loop' includes itself"):
        _expanded("s", "-- include: loop", fragments)


_TASK_UPDATE_SET = re.compile(
    r"UPDATE\s+toolkit_tasks\b[^;]*?\bSET\b(?P<set>.*?)(?:\bFROM\b|\bWHERE\b|\bRETURNING\b)",
    re.IGNORECASE | re.DOTALL,
)
_SETS_STATE = re.compile(
    r"(?<![\w.])state\s*=\s*(?:'(?P<literal>\w+)'|CASE\b(?P<case>.*?)\bEND\b|\S)",
    re.IGNORECASE | re.DOTALL,
)
_LIVE = {"queued", "leased", "waiting"}


def _may_end(match: re.Match[str]) -> bool:
    """Whether ``state = ...`` may set a state that is not live: a literal or a CASE whose
    results are all live states does not; anything else (a column, a parameter) may."""
    if match.group("literal") is not None:
        return match.group("literal") not in _LIVE
    if match.group("case") is not None:
        results = re.findall(r"\b(?:THEN|ELSE)\s+(\S+)", match.group("case"), re.IGNORECASE)
        return any(result.strip("'") not in _LIVE for result in results)
    return True


def ending_statements(statements: dict[str, str]) -> set[str]:
    """The statements whose update of toolkit_tasks may set a state that is not live."""
    found = set()
    for name, text in statements.items():
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        for update in _TASK_UPDATE_SET.finditer(code):
            if any(_may_end(m) for m in _SETS_STATE.finditer(update.group("set"))):
                found.add(name)
    return found


#: Ending statements whose transaction's next statement releases the keys (a statement routed
#: to one shard of a distributed store cannot insert in a CTE): that statement, by name.
KEYS_RELEASED_AFTER = {"commit_fenced_on_shard": "record_key_wake"}
#: Statements that end only tasks whose end does nothing beyond their row: commit_step refers
#: back, unapplied, a lean write that ends any other (CTE locked's referred; its one caller
#: sends it again by commit_fenced: Leases.commit_many).
ENDS_ONLY_BARE = {"commit_step"}


def test_every_statement_that_ends_tasks_does_what_an_end_does() -> None:
    """The transaction-wide flag (toolkit.ends_in_statement) turns the triggers off for the
    rest of its transaction: every statement that can end a task must do their work."""
    statements = {name: query(name) for name in query_names()}
    ending = ending_statements(statements)
    assert "commit_fenced" in ending and "request_cancel" in ending  # not vacuous
    assert "claim_tasks" not in ending and "redrive_task" not in ending
    assert ENDS_ONLY_BARE <= ending
    assert all("NOT EXISTS (SELECT 1 FROM locked WHERE referred)" in statements[name]
               for name in ENDS_ONLY_BARE)
    missing = sorted(
        name
        for name in ending - ENDS_ONLY_BARE
        if "ends_in_statement" not in statements[name]
        or "INSERT INTO toolkit_key_wakes" not in statements[KEYS_RELEASED_AFTER.get(name, name)]
    )
    assert missing == []
