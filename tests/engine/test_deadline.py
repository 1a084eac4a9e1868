"""Workflow deadlines: a waiting, queued or running task stopped at its deadline, ``on_timeout``
taken, and out-of-range budgets and timeouts refused at submit."""

from __future__ import annotations

import anyio
import pytest

from tests.helpers.inprocess import deploy_submit, drain, due_in, kinds, make_due, sql
from tests.helpers.processes import eventually
from tests.helpers.workflows import definition
from toolkit.errors import InputError
from toolkit.store import Store

pytestmark = pytest.mark.anyio

DEADLINE = """
name: deadline
version: 1
timeout: 1h
start: wait
steps:
  wait: {wait: {signal: never}, next: done}
  done: {succeed: {output: done}}
"""

ON_TIMEOUT = """
name: deadline-routed
version: 1
timeout: 1h
on_timeout: late
start: work
steps:
  work: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: done}
  done: {succeed: {output: done}}
  late: {succeed: {output: "${ steps.work.error.name }"}}
"""


async def test_a_waiting_task_fails_at_its_deadline(store: Store) -> None:
    (task_id,) = await deploy_submit(store, DEADLINE, [{}])
    await drain(store, DEADLINE)
    assert 3500 < await due_in(store, task_id) <= 3600  # a wait without end: at the deadline
    await sql(store, "UPDATE toolkit_tasks SET deadline_at = statement_timestamp() WHERE id = %s",
              task_id)  # fmt: skip
    await make_due(store, task_id)
    await drain(store, DEADLINE)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "Timeout"
    assert "deadline_passed" in await kinds(store, task_id)


async def test_a_submit_overrides_the_deadline_and_a_queued_task_is_timed_out(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, DEADLINE, [{}], timeout=0.001)

    async def passed() -> bool:  # the database's clock passes a millisecond deadline
        rows = await sql(
            store, "SELECT deadline_at < clock_timestamp() FROM toolkit_tasks WHERE id = %s",
            task_id,
        )  # fmt: skip
        return bool(rows[0][0])

    await eventually(passed, what="the deadline passed")
    await drain(store, DEADLINE)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "Timeout"


async def test_a_running_step_is_stopped_at_the_deadline_and_on_timeout_taken(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, ON_TIMEOUT, [{"seconds": 60}], timeout=1)
    with anyio.fail_after(30):  # the step would run 60 s
        await drain(store, ON_TIMEOUT)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "Timeout")
    rows = await sql(store, "SELECT deadline_at FROM toolkit_tasks WHERE id = %s", task_id)
    assert rows == [(None,)]  # met by on_timeout: cleared


async def test_budgets_and_timeouts_out_of_range_are_refused_at_submit(store: Store) -> None:
    d = definition(DEADLINE)
    await store.definitions.deploy(d)
    for budget in ({"tokens": float("nan")}, {"tokens": float("inf")}, {"tokens": 1e300}):
        with pytest.raises(InputError, match="budget 'tokens' must be a number"):
            await store.tasks.submit(d, [{}], budget=budget)
    for timeout in (float("nan"), 1e20, 0):
        with pytest.raises(InputError, match="timeout must be"):
            await store.tasks.submit(d, [{}], timeout=timeout)
