"""Cancellation: a queued or waiting task ends at once, a leased one at its worker's next
heartbeat, its completed steps kept."""

from __future__ import annotations

import anyio
import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import FAST, deploy_submit, drain, sql
from tests.helpers.processes import eventually
from tests.helpers.workflows import TIMER, definition
from toolkit.errors import TaskTerminal, UnknownTask
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def test_cancel_queued_waiting_and_terminal(store: Store) -> None:
    queued, waiting = await deploy_submit(store, TIMER, [{}, {}])
    await store.leases.claim("w", [definition(TIMER).digest], 0, 30.0)
    assert await store.tasks.cancel(queued, "no longer needed") == "cancelled"
    await drain(store, TIMER)
    assert (await store.tasks.get(waiting)).state == "waiting"
    assert await store.tasks.cancel(waiting) == "cancelled"
    task = await store.tasks.get(queued)
    assert task.state == "cancelled" and task.error["message"] == "no longer needed"
    with pytest.raises(TaskTerminal, match="cannot be cancelled"):
        await store.tasks.cancel(queued)
    with pytest.raises(UnknownTask):
        await store.tasks.cancel(10**9)


SLOW = """
name: slow
version: 1
input: {type: object}
start: quick
steps:
  quick: {effect: count.work, idempotent: true, args: {value: kept}, next: slow}
  slow: {effect: count.work, idempotent: true, args: {seconds: 30}}
"""


async def test_cancel_of_a_leased_task_reaches_its_handler_at_the_next_heartbeat(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, SLOW, [{}])
    worker = Worker(store, app, [definition(SLOW)])
    shutdown = CancellationToken()

    async def cancel_when_slow_runs() -> None:
        async def slow_runs() -> bool:
            return len(await sql(store, "SELECT 1 FROM test_calls")) >= 2

        async def not_leased() -> bool:
            return (await store.tasks.get(task_id)).state != "leased"

        await eventually(slow_runs, what="the slow step")
        assert await store.tasks.cancel(task_id, "operator said so") == "requested"
        await eventually(not_leased, what="the cancel")
        shutdown.cancel()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_when_slow_runs)
            report = await WorkflowSupervisor(worker, SupervisorConfig(**FAST)).run(shutdown)
    task = await store.tasks.get(task_id)
    assert report.cancelled == 1
    assert task.state == "cancelled" and task.error["message"] == "operator said so"
    assert task.checkpoint["outputs"]["quick"]["value"] == "kept"  # completed steps stay done
    assert [e["kind"] for e in await store.tasks.events(task_id)][-2:] == [
        "cancel_requested",
        "cancelled",
    ]
