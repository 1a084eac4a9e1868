"""Sync handler calls reuse daemon threads, run side by side when they overlap, and a call
abandoned by its caller does not hold up the next one."""

from __future__ import annotations

import threading

import anyio
import pytest

from tests.helpers.inprocess import run_until_idle, submit
from tests.helpers.processes import wait_for
from toolkit.engine.threads import DaemonThreads, in_thread
from toolkit.store import Store


def test_sequential_calls_reuse_one_daemon_thread() -> None:
    pool = DaemonThreads("test-reuse", idle_seconds=5.0)
    seen: list[threading.Thread] = []
    for _ in range(20):
        wait_for(lambda: pool.started == 0 or pool._idle == 1, what="the thread counts itself idle")
        pool.submit(lambda: seen.append(threading.current_thread()))
    wait_for(lambda: len(seen) == 20, what="20 jobs to run")
    assert pool.started == 1, f"threads started: {pool.started}; ran in {[t.name for t in seen]}"
    assert {thread.name for thread in seen} == {"test-reuse 1"}
    assert seen[0].daemon


def test_overlapping_calls_each_get_a_thread() -> None:
    pool = DaemonThreads("test-overlap", idle_seconds=5.0)
    barrier = threading.Barrier(4, timeout=5.0)
    for _ in range(3):
        pool.submit(barrier.wait)  # passes only when all three run at once, with this thread
    barrier.wait()
    assert pool.started == 3


def test_an_idle_thread_ends_after_its_idle_time() -> None:
    pool = DaemonThreads("test-idle", idle_seconds=0.05)

    def alive() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("test-idle")]

    ran = threading.Event()
    pool.submit(ran.set)
    assert ran.wait(5.0)
    wait_for(lambda: not alive(), what="the idle thread to end")
    again = threading.Event()
    pool.submit(again.set)  # its idle thread gone, the pool starts a new one
    assert again.wait(5.0)
    assert pool.started == 2


@pytest.mark.anyio
async def test_in_thread_returns_the_result_and_raises_the_error() -> None:
    assert await in_thread(lambda: 41 + 1) == 42

    def fails() -> None:
        raise ValueError("from the handler")

    with pytest.raises(ValueError, match="from the handler"):
        await in_thread(fails)


@pytest.mark.anyio
async def test_an_abandoned_call_does_not_block_the_next() -> None:
    release = threading.Event()
    with anyio.move_on_after(0.05) as scope:
        await in_thread(lambda: release.wait(10.0))
    assert scope.cancelled_caught, "the call was meant to be abandoned at its deadline"
    assert await in_thread(lambda: "next") == "next"
    release.set()


SYNC_STREAM = """
name: sync-stream
version: 1
input: {type: object}
start: s
steps:
  s: {effect: count.stream_sync, idempotent: true, args: {count: 3}}
"""


@pytest.mark.anyio
async def test_a_sync_handler_publishes_through_the_event_loops_token(store: Store) -> None:
    """``ctx.publish_sync`` and ``ctx.progress_sync`` reach the event loop from the handler's
    thread by the loop's token (`Cycle.loop_token`, kept per loop); twice, so that the
    second cycle takes the kept token."""
    for round_ in range(2):
        (task_id,) = await submit(store, SYNC_STREAM, [{}])
        report = await run_until_idle(store, SYNC_STREAM)
        task = await store.tasks.get(task_id)
        assert (report.succeeded, task.state) == (1, "succeeded"), (round_, task)
        items = [event.value for event in await store.streams.items(task_id)]
        assert items == [{"token": n} for n in range(3)], (round_, items)
