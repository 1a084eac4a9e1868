"""Awaiting a task's result: the output, the task's error raised, or a timeout.

The waits here poll once an hour: only the notification an ending sends can end them in
time, so each test that finishes proves the LISTEN/NOTIFY path (the poll is the fallback).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.helpers.inprocess import deploy_submit, drain, sql
from tests.helpers.processes import eventually
from toolkit.errors import TaskCancelled, TaskFailed, UnknownTask, WaitTimedOut
from toolkit.store import Store

pytestmark = pytest.mark.anyio

HOLD = """
name: hold-result
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {signal: go}, next: route}
  route:
    choice:
      - when: "${ steps.hold.fail }"
        next: broken
    default: done
  done: {succeed: {output: {got: "${ steps.hold.value }"}}}
  broken: {fail: {error: Refused, message: "refused by the signal"}}
"""

HOUR = 3600.0


async def _awaited(store: Store, task_id: int) -> bool:
    rows = await sql(store, "SELECT awaited FROM toolkit_tasks WHERE id = %s", task_id)
    return bool(rows[0][0])


async def _end_while_awaited(store: Store, task_id: int, payload: Any) -> Any:
    """Await the task's result while a signal and a worker end it; what the wait gave."""
    outcome: dict[str, Any] = {}

    async def wait() -> None:
        try:
            outcome["value"] = await store.tasks.result(task_id, timeout=60, poll=HOUR)
        except Exception as exc:  # the task's error, checked by the caller
            outcome["error"] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        await eventually(lambda: _awaited(store, task_id), what=f"task {task_id} awaited")
        if payload is None:
            await store.tasks.cancel(task_id, "no longer wanted")
        else:
            await store.tasks.signal(task_id, "go", payload)
            await drain(store, HOLD)
    return outcome


async def test_result_returns_the_output_when_the_task_succeeds(store: Store) -> None:
    (task_id,) = await deploy_submit(store, HOLD, [{}])
    await drain(store, HOLD)
    assert await _end_while_awaited(store, task_id, {"value": 42}) == {"value": {"got": 42}}
    # An ended task's result is read at once.
    assert await store.tasks.result(task_id, poll=HOUR) == {"got": 42}


async def test_result_raises_the_error_of_a_failed_task(store: Store) -> None:
    (task_id,) = await deploy_submit(store, HOLD, [{}])
    await drain(store, HOLD)
    error = (await _end_while_awaited(store, task_id, {"fail": True}))["error"]
    assert isinstance(error, TaskFailed) and not isinstance(error, TaskCancelled)
    assert (error.name, error.task_id, error.error["step"]) == ("Refused", task_id, "broken")
    assert str(error) == f"task {task_id} failed at step broken: Refused: refused by the signal"


async def test_result_raises_task_cancelled_for_a_cancelled_task(store: Store) -> None:
    (task_id,) = await deploy_submit(store, HOLD, [{}])
    await drain(store, HOLD)
    error = (await _end_while_awaited(store, task_id, None))["error"]
    assert isinstance(error, TaskCancelled), error
    assert str(error) == f"task {task_id} was cancelled: no longer wanted"


async def test_result_times_out_and_the_task_goes_on(store: Store) -> None:
    (task_id,) = await deploy_submit(store, HOLD, [{}])
    await drain(store, HOLD)
    with pytest.raises(WaitTimedOut, match=f"task {task_id} is waiting") as caught:
        await store.tasks.result(task_id, timeout=0.2, poll=0.05)
    assert caught.value.state == "waiting"
    assert (await store.tasks.get(task_id)).state == "waiting"


async def test_result_of_an_unknown_task_is_refused(store: Store) -> None:
    with pytest.raises(UnknownTask, match="no task 404"):
        await store.tasks.result(404, timeout=1)


async def test_result_polls_when_no_notification_comes(store: Store) -> None:
    """A task ended by a statement that bypasses the trigger's condition (the mark cleared
    by row surgery) is still found, by the poll."""
    (task_id,) = await deploy_submit(store, HOLD, [{}])
    await drain(store, HOLD)
    outcome: dict[str, Any] = {}

    async def wait() -> None:
        outcome["value"] = await store.tasks.result(task_id, timeout=60, poll=0.1)

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        await eventually(lambda: _awaited(store, task_id), what="awaited")
        await sql(
            store,
            "UPDATE toolkit_tasks SET awaited = false, state = 'succeeded', wait_reason = NULL,"
            " result = '\"by hand\"', finished_at = now() WHERE id = %s",
            task_id,
        )
    assert outcome == {"value": "by hand"}
