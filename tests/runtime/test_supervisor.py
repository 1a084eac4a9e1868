"""The supervisor in-process (``toolkit.runtime.supervisor``): a graceful shutdown, and the
heartbeat of a worker that takes its own task over."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import WORKER_FAST as FAST
from tests.helpers.inprocess import calls, run_until_idle, submit
from tests.helpers.processes import eventually
from tests.helpers.workflows import FIVE_SLOW_STEPS, definition
from toolkit.application import App
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def test_shutdown_waits_for_started_cycles_then_releases(store: Store) -> None:
    ids = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0.3}] * 2)
    worker = Worker(store, app, [definition(FIVE_SLOW_STEPS)])
    shutdown = CancellationToken()
    config = SupervisorConfig(concurrency=2, grace=0.2, **FAST)

    async def stop_when_running() -> None:
        async def running() -> bool:
            return bool(await calls(store))

        await eventually(running, what="a handler running")
        shutdown.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_when_running)
        report = await WorkflowSupervisor(worker, config).run(shutdown)
    assert report.released == 2
    for task_id in ids:
        task = await store.tasks.get(task_id)
        assert task.state == "queued" and task.lease_owner is None
    # Nothing lost: another worker finishes them, and completed steps are not re-run.
    before = await calls(store)
    await run_until_idle(store, FIVE_SLOW_STEPS, concurrency=2)
    assert [(await store.tasks.get(i)).state for i in ids] == ["succeeded", "succeeded"]
    after = await calls(store)
    assert all(after[key] <= count + 1 for key, count in before.items())


async def test_a_stopping_worker_starts_no_call_of_an_effect_that_is_not_idempotent(
    store: Store,
) -> None:
    """Within the grace a cycle finishes its call in flight, then releases its task before
    the next step that is not idempotent, rather than start a call that the end of the grace
    would cut off and leave for reconciliation.

    Regression: the cycle went on into ``s2`` (not idempotent) during the grace; on a
    slower server (a Citus cluster) SIGTERM came while ``s1`` ended, and every task of a
    worker stopped with ``--grace 0.2`` went to reconciliation at ``s2``.
    """
    (task_id,) = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0.3}])
    worker = Worker(store, app, [definition(FIVE_SLOW_STEPS)])
    shutdown = CancellationToken()
    config = SupervisorConfig(concurrency=1, grace=30.0, **FAST)  # s1 ends well within it

    async def stop_when_s1_runs() -> None:
        async def running() -> bool:
            return f"{task_id}:s1#1" in await calls(store)

        await eventually(running, what="s1's call running")
        shutdown.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_when_s1_runs)
        report = await WorkflowSupervisor(worker, config).run(shutdown)
    task = await store.tasks.get(task_id)
    history = (task.state, task.checkpoint, await store.tasks.events(task_id))
    assert report.released == 1, history
    assert task.state == "queued" and task.checkpoint["cursor"] == "s2", history
    assert list(await calls(store)) == [f"{task_id}:s1#1"], "s1 ended; s2 was never called"
    evidence = [(e["step"], e["record"]) for e in await store.tasks.evidence(task_id)]
    assert evidence == [("s1", "completed")], evidence
    released = [e for e in await store.tasks.events(task_id) if e["kind"] == "released"]
    assert [e["detail"] for e in released] == [{"reason": "worker stopping"}], history


async def test_a_worker_that_takes_over_its_own_task_keeps_the_new_lease_alive(
    store: Store,
) -> None:
    """Regression: the stale cycle's end removed the new cycle's lease from the heartbeat."""
    text = """
name: own-takeover
version: 1
input: {type: object}
start: slow
steps:
  slow: {effect: own.slow, idempotent: true}
"""
    (task_id,) = await submit(store, text, [{}])
    own = App("own")
    calls_seen: list[int] = []

    @own.effect("own.slow")
    async def slow(ctx: Any) -> dict[str, Any]:
        calls_seen.append(ctx.fencing_token)
        await anyio.sleep(1.0 if len(calls_seen) == 1 else 4.0)
        return {"token": ctx.fencing_token}

    worker = Worker(store, own, [definition(text)])
    config = SupervisorConfig(
        lease=2.0, heartbeat=0.5, idle_backoff_min=0.01, idle_backoff_max=0.05, until_idle=True
    )

    async def expire_the_first_lease() -> None:
        async def called() -> bool:
            return bool(calls_seen)

        await eventually(called, what="the first call")
        async with store.db.connection() as conn:
            await conn.execute(
                "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() - interval '1s'"
                " WHERE id = %s",
                (task_id,),
            )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(expire_the_first_lease)
            await WorkflowSupervisor(worker, config).run()
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded" and task.result == {"token": 2}
    assert calls_seen == [1, 2]  # the new lease lived through the 4 s call: no third claim


async def test_a_worker_that_stops_right_after_starting_cancels_no_statement(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (tutorial 4's stderr, now and then): an --until-idle worker that found
    nothing to do cancelled its services inside their first statements; psycopg then logged
    "query cancellation interrupted" and closed the pooled connection."""
    worker = Worker(store, app, [definition(FIVE_SLOW_STEPS)])
    config = SupervisorConfig(until_idle=True, **FAST)
    with caplog.at_level("WARNING"):
        for _ in range(15):
            await WorkflowSupervisor(worker, config).run()
    noise = [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
    assert not noise, noise


async def test_a_slot_is_claimed_again_while_its_last_write_is_on_its_way(store: Store) -> None:
    """A cycle's last write (one that releases its lease) frees its slot for the next claim
    as it is sent, not once it is applied: the claim and the write overlap (issue 22)."""
    text = """
name: gated
version: 1
input: {type: object}
start: call
steps:
  call: {effect: gate.call, idempotent: true, args: {hold: "${ input.hold }"}}
"""
    first, second = await submit(store, text, [{"hold": True}, {"hold": False}])
    gated = App("gated")
    entered, released = anyio.Event(), anyio.Event()
    called: list[bool] = []

    @gated.effect("gate.call")
    async def call(ctx: Any, hold: bool) -> dict[str, Any]:
        called.append(hold)
        if hold:
            entered.set()
            await released.wait()
        return {}

    worker = Worker(store, gated, [definition(text)])
    # No renewal while the lock is held (it would wait for it too), and no lease presumed
    # lost, which would free the slot as well.
    config = SupervisorConfig(
        concurrency=1, until_idle=True, lease=60.0, heartbeat=20.0,
        idle_backoff_min=0.01, idle_backoff_max=0.1,
    )  # fmt: skip
    tenant = (await store.tasks.get(first)).tenant

    async def hold_the_first_write() -> None:
        await entered.wait()
        async with store.db.connection() as conn, conn.transaction():
            # the first task's row locked: its last write waits for this transaction
            await conn.execute(
                "SELECT 1 FROM toolkit_tasks WHERE id = %s AND tenant = %s FOR UPDATE",
                (first, tenant),
            )
            released.set()

            async def second_called() -> bool:
                return len(called) == 2

            await eventually(
                second_called, timeout=15.0, what="the second task's call, one slot in all"
            )
            task = await store.tasks.get(first)
            assert task.state == "leased", task  # its last write still waits for the lock

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_the_first_write)
            report = await WorkflowSupervisor(worker, config).run()
    assert called == [True, False]
    states = [(await store.tasks.get(task_id)).state for task_id in (first, second)]
    assert states == ["succeeded", "succeeded"], report
