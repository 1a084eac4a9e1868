"""The worker (``toolkit.runtime.worker``): handlers and configuration checked at start, and
its identity (one live process per worker id)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import drain, submit
from tests.helpers.workflows import THREE_STEPS, V1, definition
from toolkit.application import App
from toolkit.errors import ConfigError, MissingHandlers, WorkerIdInUse
from toolkit.runtime.supervisor import SupervisorConfig
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def test_worker_refuses_missing_handlers_and_bad_config(store: Store) -> None:
    with pytest.raises(MissingHandlers, match=r"\$\.steps\.first\.effect: no handler 'count.work'"):
        Worker(store, App("empty"), [definition(THREE_STEPS)])
    with pytest.raises(ConfigError, match="at most a third of the lease"):
        SupervisorConfig(lease=3, heartbeat=2)
    with pytest.raises(ConfigError, match="claim_batch must be at least 1, not 0"):
        SupervisorConfig(claim_batch=0)


def test_a_claim_fills_half_the_slots_by_default_at_least_16() -> None:
    """docs/decisions.md, "A claim fills half the slots": a busy worker at a high concurrency
    claims bigger batches; one given a batch keeps it."""
    sizes = [SupervisorConfig(concurrency=c).claim_size for c in (1, 8, 32, 33, 64, 200)]
    assert sizes == [16, 16, 16, 16, 32, 100]
    assert SupervisorConfig(concurrency=64, claim_batch=8).claim_size == 8


UNFIT = """
name: unfit
version: 1
start: a
steps:
  a: {effect: fit.one, idempotent: true, args: {y: 1}, next: b}
  b: {effect: fit.one, idempotent: true, next: c}
  c: {effect: fit.one, idempotent: true, args: {x: "${ input.x }"}, next: d}
  d: {effect: fit.any, idempotent: true, args: {y: 1, z: 2}, next: e}
  e: {effect: fit.one, idempotent: true, args: "${ input }"}
"""


async def test_worker_refuses_handlers_whose_signature_cannot_take_the_args(
    store: Store,
) -> None:
    """Keys of ``args`` known before it renders are checked against the signature at start;
    an ``args`` expression is checked at the call: the step fails at once, no retry."""
    fit = App("fit")

    @fit.effect("fit.one")
    async def one(ctx: Any, x: int) -> int:
        return x

    @fit.effect("fit.any")
    async def any_args(ctx: Any, **kwargs: Any) -> int:
        return len(kwargs)

    @fit.effect("fit.inner")
    def inner(ctx: Any) -> None:
        raise TypeError("a fault of the handler's own")

    with pytest.raises(MissingHandlers) as caught:
        Worker(store, fit, [definition(UNFIT)])
    assert str(caught.value).splitlines() == [
        "<test>: $.steps.a.args: handler 'fit.one' cannot take these arguments: it has no"
        " parameter 'y'; it needs 'x'",
        "<test>: $.steps.b.args: handler 'fit.one' cannot take these arguments: it needs 'x'",
    ]
    late = UNFIT.replace("args: {y: 1}, next: b", "args: {x: 1}, next: b").replace(
        "idempotent: true, next: c", "idempotent: true, args: {x: 2}, next: c"
    )
    (task_id,) = await submit(store, late, [{"x": 3, "w": 4}])
    report = await drain(store, late, handlers=fit)
    task = await store.tasks.get(task_id)
    assert report.failed == 1 and task.error["name"] == "HandlerArgumentsMismatch", task.error
    assert task.error["message"] == "handler 'fit.one': it has no parameter 'w'"
    assert task.error["attempts"] == 1  # never retried
    # A TypeError the handler raises itself is its own error: retried as any other.
    inner_text = """
name: inner
version: 1
start: a
steps:
  a: {effect: fit.inner, idempotent: true, retry: {max_attempts: 2, initial: 10ms}}
"""
    (task_id,) = await submit(store, inner_text, [{}])
    await drain(store, inner_text, handlers=fit)
    error = (await store.tasks.get(task_id)).error
    assert (error["name"], error["attempts"]) == ("TypeError", 2), error


async def test_second_live_worker_with_same_id_is_refused(store: Store) -> None:
    d = definition(THREE_STEPS)
    first = Worker(store, app, [d], worker_id="same")
    await first.register(1, 30.0)
    with pytest.raises(WorkerIdInUse):
        await Worker(store, app, [d], worker_id="same").register(1, 30.0)
    await first.unregister()
    await Worker(store, app, [d], worker_id="same").register(1, 30.0)


async def test_a_dead_local_process_id_is_taken_over_a_live_one_is_refused(store: Store) -> None:
    d = definition(V1)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    await store.workers.register(
        "w", incarnation="crashed", concurrency=1, definitions=[], lease_seconds=60,
        heartbeat_seconds=20,
    )
    async with store.db.connection() as conn:  # as if a crashed process had registered it
        await conn.execute("UPDATE toolkit_workers SET pid = %s WHERE worker_id = 'w'", (dead_pid,))
    await Worker(store, app, [d], worker_id="w").register(1, 60.0)  # taken over at once
    (record,) = [w for w in await store.workers.list() if w.worker_id == "w"]
    assert record.pid == os.getpid() and record.live
    async with store.db.connection() as conn:  # held by a live process (pid 1) of this host
        await conn.execute("UPDATE toolkit_workers SET pid = 1 WHERE worker_id = 'w'")
    with pytest.raises(WorkerIdInUse, match="its own --worker-id"):
        await Worker(store, app, [d], worker_id="w").register(1, 60.0)
