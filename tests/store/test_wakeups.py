"""No lost wake-ups: a signal or a callback completion that races the worker committing its
wait always wakes the task.

The race is made to happen, not hoped for: a test connection holds the task's row lock while
the worker commits its wait, and the sender's statement starts (takes its snapshot) before
that commit is through. Synchronised on the server's own lock waits (``pg_stat_activity``),
never on sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers.inprocess import FAST, deploy_submit
from tests.helpers.processes import eventually
from tests.helpers.triggers import as_distributed
from tests.helpers.workflows import definition
from toolkit.application import App, EffectContext
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.queries import query

#: The races are ordered by waiting for the server's lock waits (pg_stat_activity): on a
#: Citus cluster the waits are on the worker nodes, which the coordinator does not list.
pytestmark = [pytest.mark.anyio, pytest.mark.one_postgresql]

app = App("gated")
GATE: dict[str, anyio.Event] = {}
TOKENS: list[str] = []


@app.effect("gate.hold")
async def hold(ctx: EffectContext) -> dict[str, Any]:
    """Return once the test opens the gate; hand out the callback token if there is one."""
    if ctx.callback_token is not None:
        TOKENS.append(ctx.callback_token)
    GATE["entered"].set()
    await GATE["release"].wait()
    return {"held": True}


SIGNALLED = """
name: gated-signal
version: 1
start: work
steps:
  work: {effect: gate.hold, idempotent: true, next: wait}
  wait: {wait: {signal: go}}
"""

CALLED_BACK = """
name: gated-callback
version: 1
start: work
steps:
  work: {effect: gate.hold, idempotent: true, callback: {}}
"""


async def lock_waiters(conn: psycopg.AsyncConnection[Any], exclude: list[int]) -> int:
    """Backends of this database waiting for a lock, but for ``exclude``."""
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND NOT (pid = ANY(%s))",
        (exclude,),
    )
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    await eventually(check, timeout=15, what=what)


@asynccontextmanager
async def worker_running(store: Store, text: str) -> AsyncIterator[WorkflowSupervisor]:
    """A supervisor of ``text`` running in this process until the block ends."""
    GATE.update(entered=anyio.Event(), release=anyio.Event())
    TOKENS.clear()
    worker = Worker(store, app, [definition(text)], worker_id="gated")
    supervisor = WorkflowSupervisor(worker, SupervisorConfig(**FAST))
    shutdown = CancellationToken()
    async with anyio.create_task_group() as group:
        group.start_soon(supervisor.run, shutdown)
        try:
            yield supervisor
        finally:
            GATE["release"].set()
            shutdown.cancel()


Send = Callable[[psycopg.AsyncConnection[Any], int], Awaitable[Any]]


async def race(store: Store, dsn: str, text: str, send: Send, *, sender_first: bool) -> None:
    """Run a gated task into the race between its wait commit and ``send``; assert it wakes.

    ``sender_first``: the sender's transaction holds the row lock while the worker's wait
    commit waits for it, and commits first. Otherwise a third connection holds the lock, the
    worker's commit queues first and the sender's statement second (its snapshot taken
    before the wait is committed), and the sender commits only once the worker's cycle has
    ended, so nothing the worker does after its own commit can see the sender's rows.
    """
    (task_id,) = await deploy_submit(store, text, [{}])
    async with (
        await psycopg.AsyncConnection.connect(dsn) as holder,
        await psycopg.AsyncConnection.connect(dsn) as sender,
        worker_running(store, text) as supervisor,
    ):
        async def queued(n: int) -> bool:
            return await lock_waiters(holder, [holder.info.backend_pid]) >= n

        async def cycle_ended() -> bool:
            return supervisor.report.cycles >= 1

        await until(lambda: _is_set(GATE["entered"]), "the handler to be called")
        if sender_first:
            await send(sender, task_id)  # the task is leased: stored, not woken; row locked
        else:
            await holder.execute(
                "SELECT 1 FROM toolkit_tasks WHERE id = %s FOR NO KEY UPDATE", (task_id,)
            )
        GATE["release"].set()  # the worker commits its wait and queues for the row
        await until(lambda: queued(1), "the wait commit to queue for the row lock")
        if sender_first:
            await sender.commit()
        else:
            sent = anyio.Event()

            async def send_now() -> None:
                await send(sender, task_id)
                sent.set()

            async with anyio.create_task_group() as group:
                group.start_soon(send_now)
                await until(lambda: queued(2), "the sender to queue behind it")
                await holder.commit()
                await until(lambda: _is_set(sent), "the sender's statement")
        await until(cycle_ended, "the worker's cycle to end")
        if not sender_first:
            await sender.commit()

        async def woken() -> bool:
            return (await store.tasks.get(task_id)).state == "succeeded"

        try:
            await until(woken, f"task {task_id} to be woken and succeed")
        except AssertionError as exc:
            task = await store.tasks.get(task_id)
            events = [e["kind"] for e in await store.tasks.events(task_id)]
            raise AssertionError(
                f"{exc}: state {task.state}, wait {task.wait_reason}, run_at {task.run_at}, "
                f"checkpoint wait {task.checkpoint.get('wait')}, events {events}, "
                f"signals {await store.tasks.signals(task_id)}"
            ) from None


async def _is_set(event: anyio.Event) -> bool:
    return event.is_set()


async def send_signal(conn: psycopg.AsyncConnection[Any], task_id: int) -> None:
    await conn.execute(
        query("send_signal"),
        {"task_id": task_id, "tenant": "default", "name": "go", "payload": Jsonb(None),
         "plan_id": None, "operator": None, "address": None, "event_id": None},
    )


async def complete_callback(conn: psycopg.AsyncConnection[Any], task_id: int) -> None:
    await conn.execute(
        query("complete_callback"),
        {"callback_token": TOKENS[0], "tenant": "default", "result": Jsonb({"done": True}),
         "error": None},
    )


SENDER_FIRST = pytest.mark.parametrize(
    "sender_first", [True, False], ids=["sender-first", "worker-first"]
)


@SENDER_FIRST
async def test_a_signal_racing_the_wait_commit_wakes_the_task(
    store: Store, dsn: str, sender_first: bool
) -> None:
    await race(store, dsn, SIGNALLED, send_signal, sender_first=sender_first)


@SENDER_FIRST
async def test_a_callback_completion_racing_the_wait_commit_wakes_the_task(
    store: Store, dsn: str, sender_first: bool
) -> None:
    await race(store, dsn, CALLED_BACK, complete_callback, sender_first=sender_first)


# --- a branch that parks (issue 18) -------------------------------------------------------

BRANCH_SIGNALLED = """
name: gated-branch-signal
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        only:
          start: work
          steps:
            work: {effect: gate.hold, idempotent: true, next: wait}
            wait: {wait: {signal: go}}
"""

BRANCH_CALLED_BACK = """
name: gated-branch-callback
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        only:
          start: work
          steps:
            work: {effect: gate.hold, idempotent: true, callback: {timeout: 1h}}
"""


async def signal_branches(conn: psycopg.AsyncConnection[Any], task_id: int) -> None:
    """What ``store.tasks.signal`` sends: the signal, then the wake of a branch waiting for
    it, in a statement of its own after the first locked the task's row."""
    await send_signal(conn, task_id)
    keys = [{"task_id": task_id, "key": "signal:go", "address": None}]
    await conn.execute(query("wake_branches"), {"keys": Jsonb(keys), "tenant": "default"})


async def complete_branch_callback(conn: psycopg.AsyncConnection[Any], task_id: int) -> None:
    await complete_callback(conn, task_id)
    keys = [{"task_id": task_id, "key": f"callback:{TOKENS[0]}", "address": None}]
    await conn.execute(query("wake_branches"), {"keys": Jsonb(keys), "tenant": "default"})


#: The group commit's statements of one PostgreSQL, or those of a store distributed by
#: tenant (`as_distributed`: the parked branches' wakes as four routed statements).
LAYOUTS = pytest.mark.parametrize("distributed", [False, True], ids=["one", "distributed"])


@SENDER_FIRST
@LAYOUTS
async def test_a_signal_racing_a_branch_parking_wakes_the_branch(
    store: Store, dsn: str, sender_first: bool, distributed: bool
) -> None:
    """Regression: the branch's wake was a CTE of the sender's one statement, whose snapshot
    predated the branch's row being written waiting (worker-first): the branch stayed
    parked with its signal stored."""
    if distributed:
        await as_distributed(store)
    await race(store, dsn, BRANCH_SIGNALLED, signal_branches, sender_first=sender_first)


@SENDER_FIRST
@LAYOUTS
async def test_a_completion_racing_a_branch_parking_wakes_the_branch(
    store: Store, dsn: str, sender_first: bool, distributed: bool
) -> None:
    if distributed:
        await as_distributed(store)
    await race(
        store, dsn, BRANCH_CALLED_BACK, complete_branch_callback, sender_first=sender_first
    )
