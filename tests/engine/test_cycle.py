"""A cycle through database faults, in-process: its writes are tried again within its lease
(a lost reply, a short outage) and given up at the lease deadline; a signal wait's wake-up
is part of its own commit, and a signal look-up is tried again too."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import submit
from tests.helpers.outages import run_until_idle, sql
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.engine import CycleControl, CycleOutcome, Interpreter
from toolkit.errors import DatabaseUnavailable
from toolkit.lifecycle import TaskState
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio


class FlakyCommit:
    """A commit function whose first ``failures`` calls find the database unreachable."""

    def __init__(self, store: Store, failures: int, *, applied_before_failing: bool) -> None:
        self._store = store
        self.failures = failures
        self.applied_before_failing = applied_before_failing
        self.calls = 0

    async def __call__(self, write: FencedWrite) -> TaskState:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            if self.applied_before_failing:  # the reply was lost, not the write
                await self._store.leases.commit(write)
            raise DatabaseUnavailable("cannot reach PostgreSQL: connection lost")
        return await self._store.leases.commit(write)


@pytest.mark.parametrize("applied_before_failing", [False, True])
async def test_a_cycle_writes_through_a_short_outage_within_its_lease(
    store: Store, applied_before_failing: bool
) -> None:
    """Every write of a cycle finds the database away once; the cycle tries again within its
    lease, so even the non-idempotent step's intent and outcome land exactly once."""
    d = definition(THREE_STEPS)
    (task_id,) = await submit(store, THREE_STEPS, [{"n": 3}])
    (task,) = await store.leases.claim("worker", [d.digest], 1, 30.0)
    flaky = FlakyCommit(store, 3, applied_before_failing=applied_before_failing)
    interpreter = Interpreter(store, app, "worker", commit=flaky)
    control = CycleControl(lease_deadline=anyio.current_time() + 25)
    assert await interpreter.execute(task, d, control) is CycleOutcome.SUCCEEDED
    assert flaky.failures == 0 and flaky.calls > 3
    record = await store.tasks.get(task_id)
    assert record.state == "succeeded" and record.result == {"step": "third", "value": 3,
                                                              "attempt": 1}  # fmt: skip
    evidence = [(e["step"], e["record"]) for e in await store.tasks.evidence(task_id)]
    assert evidence == [
        ("first", "completed"), ("second", "started"), ("second", "completed"),
        ("third", "completed"),
    ]  # fmt: skip


async def test_a_cycle_gives_up_at_its_lease_deadline_and_writes_nothing(store: Store) -> None:
    d = definition(THREE_STEPS)
    (task_id,) = await submit(store, THREE_STEPS, [{"n": 3}])
    (task,) = await store.leases.claim("worker", [d.digest], 1, 30.0)
    flaky = FlakyCommit(store, 1_000, applied_before_failing=False)
    interpreter = Interpreter(store, app, "worker", commit=flaky)
    control = CycleControl(lease_deadline=anyio.current_time() + 0.5)
    started = time.monotonic()
    assert await interpreter.execute(task, d, control) is CycleOutcome.LEASE_LOST
    assert time.monotonic() - started < 2.0 and flaky.calls > 2
    assert (await store.tasks.get(task_id)).state == "leased"  # it lapses on its own
    assert await store.tasks.evidence(task_id) == []
    # Without a deadline (no supervisor renewing the lease) it does not try again.
    outcome = await Interpreter(store, app, "worker", commit=flaky).execute(task, d)
    assert outcome is CycleOutcome.DATABASE_UNAVAILABLE


SIGNAL_WAIT = """
name: signal-wait
version: 1
input: {type: object}
start: wait
steps:
  wait: {wait: {signal: go}, next: done}
  done: {succeed: {output: "${ steps.wait }"}}
"""


async def test_a_signal_wait_is_not_stuck_when_the_wake_check_fails(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal sent while the task was still leased must wake the wait the cycle commits,
    by that commit itself: nothing after it is needed (the database may go away then)."""
    d = definition(SIGNAL_WAIT)
    (task_id,) = await submit(store, SIGNAL_WAIT, [{}])
    (task,) = await store.leases.claim("worker", [d.digest], 1, 30.0)
    real_next_signal = store.leases.next_signal

    async def next_signal(
        task_id: int, names: Any, taken: Any = (), address: Any = None, *, tenant: str
    ) -> Any:
        found = await real_next_signal(task_id, names, taken, address, tenant=tenant)
        await store.tasks.signal(task_id, names[0], {"ok": True})  # arrives just after the look
        return found

    monkeypatch.setattr(store.leases, "next_signal", next_signal)
    interpreter = Interpreter(store, app, "worker")
    assert await interpreter.execute(task, d) is CycleOutcome.WAITING
    monkeypatch.undo()
    (due,) = await sql(
        store.db.dsn, "SELECT run_at <= clock_timestamp() FROM toolkit_tasks WHERE id = %s",
        (task_id,),
    )  # fmt: skip
    assert due == (True,), "the stored signal did not make the wait due"
    report = await run_until_idle(Worker(store, app, [d]))
    assert report.succeeded == 1
    assert (await store.tasks.get(task_id)).result == {"ok": True}


async def test_a_signal_look_up_is_tried_again_within_the_lease(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = definition(SIGNAL_WAIT)
    (task_id,) = await submit(store, SIGNAL_WAIT, [{}])
    await store.tasks.signal(task_id, "go", {"ok": 1})
    (task,) = await store.leases.claim("worker", [d.digest], 1, 30.0)
    real_next_signal = store.leases.next_signal
    failures = 2

    async def next_signal(
        task_id: int, name: str, taken: Any = (), address: Any = None, *, tenant: str
    ) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise DatabaseUnavailable("cannot reach PostgreSQL: connection lost")
        return await real_next_signal(task_id, name, taken, address, tenant=tenant)

    monkeypatch.setattr(store.leases, "next_signal", next_signal)
    interpreter = Interpreter(store, app, "worker")
    control = CycleControl(lease_deadline=anyio.current_time() + 25)
    assert await interpreter.execute(task, d, control) is CycleOutcome.SUCCEEDED
    assert failures == 0 and (await store.tasks.get(task_id)).result == {"ok": 1}


FANOUT = """
name: two-branches
version: 1
input: {type: object}
start: fan
steps:
  fan:
    parallel:
      branches:
        a: {start: work, steps: {work: {effect: count.work, idempotent: true}}}
        b: {start: work, steps: {work: {effect: count.work, idempotent: true}}}
    next: done
  done: {succeed: {output: "${ steps.fan }"}}
"""


class FirstFanOutWriteLost:
    """A commit that fails the first write carrying ``fanout_started`` once every other task
    of the cycle is blocked (the other branch waits for the write lock), then applies all
    later writes: a write given up while another branch's commit is queued behind it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failed: FencedWrite | None = None
        self.applied: list[FencedWrite] = []

    async def __call__(self, write: FencedWrite) -> TaskState:
        if self.failed is None and any(e.kind == "fanout_started" for e in write.events):
            self.failed = write
            await anyio.wait_all_tasks_blocked()
            raise DatabaseUnavailable("cannot reach PostgreSQL: connection lost")
        self.applied.append(write)
        return await self._store.leases.commit(write)


async def test_a_write_given_up_is_sent_again_before_any_later_write_of_the_cycle(
    store: Store,
) -> None:
    """Regression (chaos run, seed 1): branch a's write, which carried the fan-out's start
    event and both branch rows, was given up; branch b's commit, queued behind it, then
    applied a checkpoint counting both branches begun with neither row stored, and the task
    waited for its branches for ever. A later write must first send the lost one again."""
    d = definition(FANOUT)
    (task_id,) = await submit(store, FANOUT, [{}])
    (task,) = await store.leases.claim("worker", [d.digest], 1, 30.0)
    commit = FirstFanOutWriteLost(store)
    outcome = await Interpreter(store, app, "worker", commit=commit).execute(task, d)
    assert commit.failed is not None
    # Whatever the cycle wrote after the lost write, the lost write was applied first.
    if commit.applied:
        assert commit.applied[0] is commit.failed, (outcome, commit.applied)
    # The task then finishes from what the store has, with both branches' rows.
    await sql(
        store.db.dsn,
        "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() WHERE id = %s",
        (task_id,),
    )
    report = await run_until_idle(Worker(store, app, [d]))
    record = await store.tasks.get(task_id)
    history = [e["kind"] for e in await store.tasks.events(task_id)]
    assert record.state == "succeeded", (record, history, report)
    assert history.count("fanout_started") == 1, history
