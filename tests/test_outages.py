"""Database faults, in-process: terminated connections, a server restart, an exhausted pool,
refused statements. The worker tries again with backoff, never crashes, never commits under a
lease it may have lost, and logs one line per outage."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import anyio
import psycopg
import pytest
from anyio.abc import TaskGroup

from tests.apps.counting import app, record_call
from tests.conftest import PrivateServer
from tests.processes import eventually
from tests.workflows import FIVE_SLOW_STEPS, THREE_STEPS, definition
from toolkit.application import App, EffectContext
from toolkit.engine import CycleControl, CycleOutcome, Interpreter
from toolkit.errors import DatabaseUnavailable, StoreError
from toolkit.lifecycle import TaskState
from toolkit.metrics import WorkerMetrics
from toolkit.runtime import listener as listener_module
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.group_commit import GroupCommit
from toolkit.store.writes import Event, EvidenceRecord, FencedWrite

pytestmark = pytest.mark.anyio

FAST = dict(lease=3.0, heartbeat=0.3, idle_backoff_min=0.01, idle_backoff_max=0.2)


async def submit(store: Store, text: str, inputs: list[Any]) -> list[int]:
    d = definition(text)
    await store.definitions.deploy(d)
    return await store.tasks.submit(d, inputs)


async def run_until_idle(worker: Worker, **config: Any) -> Any:
    return await WorkflowSupervisor(
        worker, SupervisorConfig(until_idle=True, **{**FAST, **config})
    ).run()


async def sql(dsn: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run a statement on a connection of the test's own (not a worker's)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(statement, params)  # type: ignore[arg-type]
        return await cursor.fetchall() if cursor.description else []


async def terminate_worker_connections(dsn: str) -> int:
    """``pg_terminate_backend`` every connection of the toolkit to this test's database."""
    rows = await sql(
        dsn,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'runifold' AND datname = current_database()",
    )
    return int(rows[0][0])


def toolkit_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("toolkit") and r.levelno >= level]


async def assert_sound_history(dsn: str, ids: list[int]) -> None:
    """Every task succeeded; no occurrence has two outcomes; no call beyond those allowed.

    A handler may be called again only after a recorded failure of the same key (a retry) or
    a lost idempotent attempt; a completed or uncertain call is never repeated.
    """
    states = await sql(dsn, "SELECT id, state, error FROM toolkit_tasks WHERE id = ANY(%s)", (ids,))
    assert all(state == "succeeded" for _, state, _ in states), states
    outcomes = await sql(
        dsn,
        "SELECT task_id, occurrence, count(*) FROM toolkit_effect_evidence "
        "WHERE record = 'completed' GROUP BY 1, 2 HAVING count(*) > 1",
    )
    assert outcomes == [], f"an occurrence completed twice: {outcomes}"
    calls = dict(await sql(dsn, "SELECT idempotency_key, calls FROM test_calls"))
    failed = dict(
        await sql(
            dsn,
            "SELECT idempotency_key, count(*) FROM toolkit_effect_evidence "
            "WHERE record = 'failed' GROUP BY 1",
        )
    )
    lost = dict(
        await sql(
            dsn,
            "SELECT task_id || ':' || (detail ->> 'occurrence'), count(*) "
            "FROM toolkit_task_events WHERE kind = 'attempt_lost' GROUP BY 1",
        )
    )
    for key, n in calls.items():
        allowed = 1 + failed.get(key, 0) + lost.get(key, 0)
        assert n <= allowed, f"{key} called {n} times, allowed {allowed}"


# --- services that must never end the run ----------------------------------------------------


async def test_heartbeat_survives_a_refused_renewal(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    (task_id,) = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0.1}])
    worker = Worker(store, app, [definition(FIVE_SLOW_STEPS)])
    real_renew = worker.renew
    refused = 0

    async def renew(held: dict[int, int], lease: float) -> dict[int, Any]:
        nonlocal refused
        if refused < 2:
            refused += 1
            raise StoreError("database error 40P01: deadlock detected")
        return await real_renew(held, lease)

    monkeypatch.setattr(worker, "renew", renew)
    report = await run_until_idle(worker, heartbeat=0.05)
    assert refused == 2 and report.succeeded == 1
    assert (await store.tasks.get(task_id)).state == "succeeded"


async def test_listen_loop_survives_an_error_that_is_no_outage(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    (task_id,) = await submit(store, THREE_STEPS, [{"n": 1}])
    monkeypatch.setattr(listener_module, "_LISTEN", "LISTEN 1")  # a syntax error, SQLSTATE 42601
    report = await run_until_idle(Worker(store, app, [definition(THREE_STEPS)]))
    assert report.succeeded == 1  # polling found the work
    assert (await store.tasks.get(task_id)).state == "succeeded"


async def test_definition_gauge_refresh_survives_a_refused_statement(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(store, THREE_STEPS, [{"n": 1}])

    async def refused() -> Any:
        raise StoreError("database error 42P01: relation does not exist")

    monkeypatch.setattr(store.definitions, "unavailable", refused)
    report = await run_until_idle(Worker(store, app, [definition(THREE_STEPS)]))
    assert report.succeeded == 1


async def test_claim_loop_survives_a_refused_claim(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(store, THREE_STEPS, [{"n": 1}])
    worker = Worker(store, app, [definition(THREE_STEPS)])
    real_claim = worker.claim
    refused = 0

    async def claim(limit: int, lease: float) -> Any:
        nonlocal refused
        if not refused:
            refused += 1
            raise StoreError("database error 40001: could not serialize access")
        return await real_claim(limit, lease)

    monkeypatch.setattr(worker, "claim", claim)
    report = await run_until_idle(worker, idle_backoff_max=0.05)
    assert refused == 1 and report.succeeded == 1


# --- the group commit writer -----------------------------------------------------------------


async def _running_writer(tg: TaskGroup, store: Store) -> GroupCommit:
    writer = GroupCommit(store.leases)
    tg.start_soon(writer.run)
    await anyio.wait_all_tasks_blocked()
    return writer


async def _commit_all(
    writer: GroupCommit, writes: dict[str, FencedWrite]
) -> dict[str, TaskState | BaseException]:
    """Queue every write in the same turn of the loop (one batch); collect each outcome."""
    results: dict[str, TaskState | BaseException] = {}

    async def commit(name: str, write: FencedWrite) -> None:
        try:
            results[name] = await writer.commit(write)
        except Exception as exc:
            results[name] = exc

    async with anyio.create_task_group() as tg:
        for name, write in writes.items():
            tg.start_soon(commit, name, write)
    return results


async def test_group_commit_writer_survives_a_write_the_driver_cannot_send(store: Store) -> None:
    """A value the driver cannot adapt (TypeError, RecursionError) fails that write only."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}, {"n": 2}])
    a, b = await store.leases.claim("w", [d.digest], 2, 30.0)
    async with anyio.create_task_group() as tg:
        writer = await _running_writer(tg, store)
        results = await _commit_all(
            writer,
            {
                "good": FencedWrite(a.fence("w"), a.checkpoint, state="succeeded", result=1),
                "bad": FencedWrite(b.fence("w"), {**b.checkpoint, "x": object()}),
            },
        )
        assert results["good"] == "succeeded"
        assert isinstance(results["bad"], StoreError)
        # The writer still runs: the task of the refused write can still be failed cleanly.
        failed = FencedWrite(b.fence("w"), b.checkpoint, state="failed", error={"name": "X"})
        assert await writer.commit(failed) == "failed"
        tg.cancel_scope.cancel()


async def test_two_writes_of_one_task_in_one_batch_apply_in_order(store: Store) -> None:
    """A cycle cancelled while its write waits writes again at once (release, cancel): both
    writes may be queued together; they apply one after the other, never merged."""
    d = definition(THREE_STEPS)
    await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    record = EvidenceRecord(
        occurrence="first#1", step="first", handler="count.work", idempotent=True,
        idempotency_key=f"{task.id}:first#1", record="completed", attempt=1, result={"v": 1},
    )  # fmt: skip
    progress = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second"}, evidence=(record,)
    )
    release = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second", "steps_run": 1},
        state="queued", delay_seconds=0, events=(Event("released"),),
    )  # fmt: skip
    async with anyio.create_task_group() as tg:
        writer = await _running_writer(tg, store)
        results = await _commit_all(writer, {"progress": progress, "release": release})
        tg.cancel_scope.cancel()
    assert results == {"progress": "leased", "release": "queued"}
    row = await store.tasks.get(task.id)
    assert row.state == "queued" and row.checkpoint["steps_run"] == 1
    assert [e["record"] for e in await store.tasks.evidence(task.id)] == ["completed"]


# --- fenced writes sent again ------------------------------------------------------------------


async def test_a_write_sent_again_after_a_lost_reply_applies_once(store: Store) -> None:
    """The reply of a commit can be lost with its connection; the write is sent again. The
    write id makes the second send a no-op that reports the write applied."""
    d = definition(THREE_STEPS)
    (task_id,) = await submit(store, THREE_STEPS, [{"n": 1}])
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)
    record = EvidenceRecord(
        occurrence="first#1", step="first", handler="count.work", idempotent=True,
        idempotency_key=f"{task_id}:first#1", record="completed", attempt=1, result={"v": 1},
    )  # fmt: skip
    progress = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": "second"},
        evidence=(record,), events=(Event("progress"),), write_id=f"{task.token}:1",
    )  # fmt: skip
    assert await store.leases.commit_many([progress]) == {task_id: "leased"}
    assert await store.leases.commit_many([progress]) == {task_id: "leased"}
    done = FencedWrite(
        task.fence("w"), {**task.checkpoint, "cursor": None}, state="succeeded",
        result={"v": 1}, events=(Event("succeeded"),), write_id=f"{task.token}:2",
    )  # fmt: skip
    assert await store.leases.commit(done) == "succeeded"
    assert await store.leases.commit(done) == "succeeded"  # applied, though no lease now
    assert len(await store.tasks.evidence(task_id)) == 1
    kinds = [e["kind"] for e in await store.tasks.events(task_id)]
    assert kinds == ["submitted", "claimed", "progress", "succeeded"]
    # Without a write id nothing tells a second send from a new write: the fence decides.
    stale = FencedWrite(task.fence("w"), task.checkpoint, state="failed")
    assert await store.leases.commit_many([stale]) == {}


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

    async def next_signal(task_id: int, names: Any, taken: Any = ()) -> Any:
        found = await real_next_signal(task_id, names, taken)
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

    async def next_signal(task_id: int, name: str, taken: Any = ()) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise DatabaseUnavailable("cannot reach PostgreSQL: connection lost")
        return await real_next_signal(task_id, name, taken)

    monkeypatch.setattr(store.leases, "next_signal", next_signal)
    interpreter = Interpreter(store, app, "worker")
    control = CycleControl(lease_deadline=anyio.current_time() + 25)
    assert await interpreter.execute(task, d, control) is CycleOutcome.SUCCEEDED
    assert failures == 0 and (await store.tasks.get(task_id)).result == {"ok": 1}


# --- real outages ---------------------------------------------------------------------------


async def test_terminated_connections_mid_run(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Every connection of the worker is terminated three times while it runs: no crash, every
    task succeeds, nothing completes twice, one warning per outage at most."""
    caplog.set_level(logging.INFO, logger="toolkit")
    ids = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0.15}] * 6)
    worker = Worker(store, app, [definition(FIVE_SLOW_STEPS)])
    kills = []

    async def calls() -> int:
        (row,) = await sql(store.db.dsn, "SELECT coalesce(sum(calls), 0) FROM test_calls")
        return int(row[0])

    async def killer() -> None:
        # Each kill lands while handlers run, once the worker has made progress since the
        # last one (it reconnected and called a handler again).
        for _ in range(3):
            before = await calls()

            async def progressed(before: int = before) -> bool:
                return await calls() > before

            await eventually(progressed, what="a handler call since the last kill")
            kills.append(await terminate_worker_connections(store.db.dsn))

    async with anyio.create_task_group() as tg:
        tg.start_soon(killer)
        report = await run_until_idle(worker, concurrency=6)
    assert len(kills) == 3 and all(n > 0 for n in kills)
    assert report.succeeded == 6 and report.failed == 0
    await assert_sound_history(store.db.dsn, ids)
    warnings = toolkit_records(caplog, logging.WARNING)
    assert 1 <= report.database_outages <= 3
    assert len(warnings) <= 2 * report.database_outages, [r.getMessage() for r in warnings]
    assert not [r for r in toolkit_records(caplog, logging.ERROR)]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


HOLDING = App("holding")


@HOLDING.effect("hold.connection")
async def hold_connection(ctx: EffectContext, seconds: float = 1.0) -> dict[str, Any]:
    async with ctx.connection() as conn:
        await conn.execute("SELECT pg_sleep(%s)", (seconds,))
    return {"held": seconds}


HOLD = """
name: hold
version: 1
input: {type: object}
start: hold
steps:
  hold: {effect: hold.connection, idempotent: true, args: {seconds: 1.2}}
"""


async def test_handlers_holding_every_connection_do_not_starve_the_heartbeat(dsn: str) -> None:
    """A pool of one connection, held by handlers for longer than the lease: heartbeats use
    their own reserved connection, so no lease is lost and nothing runs twice."""
    async with await Store.open(dsn, pool_size=1, migrate_schema=False) as store:
        ids = await submit(store, HOLD, [{}] * 3)
        worker = Worker(store, HOLDING, [definition(HOLD)])
        report = await run_until_idle(worker, concurrency=3, lease=1.0, heartbeat=0.25)
        assert report.succeeded == 3
        assert report.lease_lost == 0 and report.recovered == 0
        assert [(await store.tasks.get(i)).attempts for i in ids] == [1, 1, 1]


async def test_a_stale_worker_never_commits_after_a_takeover(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker A loses its connections and its lease while a handler runs; B takes the task
    over and finishes it; A's late writes are refused by the fence, and A says so."""
    caplog.set_level(logging.INFO, logger="toolkit")
    gate = anyio.Event()
    slow = App("slow")

    @slow.effect("count.work")
    async def work(ctx: EffectContext, seconds: float = 0, value: Any = None) -> dict[str, Any]:
        if ctx.fencing_token == 1:
            await gate.wait()  # A's handler outlives A's lease
        return {"token": ctx.fencing_token}

    d = definition(FIVE_SLOW_STEPS)
    (task_id,) = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0}])
    metrics_a = WorkerMetrics()
    supervisor_a = WorkflowSupervisor(
        Worker(store, slow, [d], worker_id="A"),
        # One slot: A cannot claim the task back itself while its handler still runs.
        SupervisorConfig(concurrency=1, lease=30.0, heartbeat=10.0, idle_backoff_max=0.05),
        metrics_a,
    )
    shutdown_a = CancellationToken()

    async def take_over_then_release_a() -> None:
        async def a_holds_it() -> bool:
            return (await store.tasks.get(task_id)).lease_owner == "A"

        await eventually(a_holds_it, what="worker A's lease")
        await terminate_worker_connections(store.db.dsn)
        await sql(
            store.db.dsn,
            "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() - interval '1 s' "
            "WHERE id = %s",
            (task_id,),
        )
        async with await Store.open(store.db.dsn, migrate_schema=False) as store_b:
            report_b = await run_until_idle(Worker(store_b, slow, [d], worker_id="B"))
        assert report_b.recovered == 1 and report_b.succeeded == 1
        gate.set()  # A's handler returns now; A tries to commit under its lost lease

        async def a_cycle_ended() -> bool:
            return bool(supervisor_a.report.cycles)

        await eventually(a_cycle_ended, what="worker A's cycle to end")
        shutdown_a.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(take_over_then_release_a)
        report_a = await supervisor_a.run(shutdown_a)
    assert report_a.lease_lost == 1 and report_a.succeeded == 0
    assert metrics_a.registry.get_sample_value("toolkit_lease_losses_total") == 1
    record = await store.tasks.get(task_id)
    assert record.state == "succeeded" and record.lease_token == 2
    # Nothing at all was written under A's token after B's claim.
    (claimed_at,) = await sql(
        store.db.dsn,
        "SELECT at FROM toolkit_task_events WHERE task_id = %s AND kind = 'recovered'",
        (task_id,),
    )
    late = await sql(
        store.db.dsn,
        "SELECT kind FROM toolkit_task_events WHERE task_id = %s AND fencing_token = 1 "
        "AND at > %s UNION ALL SELECT record FROM toolkit_effect_evidence "
        "WHERE task_id = %s AND fencing_token = 1 AND recorded_at > %s",
        (task_id, claimed_at[0], task_id, claimed_at[0]),
    )
    assert late == []
    assert any(r.__dict__.get("action") == "lease_lost" for r in caplog.records)


async def test_server_restart_mid_run(
    private_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The server stops for a while and starts again: the worker waits, resumes, finishes
    every task, and logs the outage once."""
    caplog.set_level(logging.INFO, logger="toolkit")
    dsn = private_server.dsn
    async with await Store.open(dsn, migrate_schema=False) as store:
        ids = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0.2}] * 4)
        worker = Worker(store, app, [definition(FIVE_SLOW_STEPS)])

        async def restart() -> None:
            async def running() -> bool:
                return bool(await sql(dsn, "SELECT 1 FROM test_calls LIMIT 1"))

            await eventually(running, what="a handler running")
            await anyio.to_thread.run_sync(private_server.stop)
            await anyio.sleep(1.0)
            await anyio.to_thread.run_sync(private_server.start)

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart)
            report = await run_until_idle(worker, concurrency=4, lease=8.0, heartbeat=0.5)
        assert report.succeeded == 4
        assert report.database_outages == 1
        await assert_sound_history(dsn, ids)
    warnings = toolkit_records(caplog, logging.WARNING)
    assert len(warnings) == 1 and warnings[0].__dict__["action"] == "database_unavailable"
    back = [r for r in caplog.records if r.__dict__.get("action") == "database_back"]
    assert len(back) == 1
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


SLOW_ONCE = App("slow-once")


@SLOW_ONCE.effect("slow.first_attempt")
async def slow_first_attempt(ctx: EffectContext, seconds: float = 0.0) -> dict[str, Any]:
    """Count the call; sleep ``seconds`` on the first attempt only."""
    await record_call(ctx)
    if ctx.attempt == 1:
        await anyio.sleep(seconds)
    return {"attempt": ctx.attempt}


SLOW_THEN_ONCE = """
name: slow-then-once
version: 1
input: {type: object}
start: slow
steps:
  slow: {effect: slow.first_attempt, idempotent: true, args: {seconds: "${ input.seconds }"},
         next: once}
  once: {effect: slow.first_attempt, idempotent: false}
"""


async def test_an_outage_longer_than_the_lease_cancels_cycles_which_write_nothing(
    private_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The server is away for longer than the lease: the leases are presumed lost, their
    cycles cancelled without writing; once back, the tasks are claimed again and finish.
    The report and the lease-loss metric say what happened; the log says it once."""
    caplog.set_level(logging.INFO, logger="toolkit")
    dsn = private_server.dsn
    async with await Store.open(dsn, migrate_schema=False) as store:
        # Task 1's handler sleeps through the outage: the heartbeat finds its lease overdue.
        # The others are between store calls: they give up at their lease deadline.
        ids = await submit(store, SLOW_THEN_ONCE, [{"seconds": 3.0}, {"seconds": 0.2}, {}])
        worker = Worker(store, SLOW_ONCE, [definition(SLOW_THEN_ONCE)])
        metrics = WorkerMetrics()
        supervisor = WorkflowSupervisor(
            worker,
            SupervisorConfig(until_idle=True, concurrency=3, **{**FAST, "lease": 1.2}),
            metrics,
        )

        async def long_outage() -> None:
            async def three_running() -> bool:
                return len(await sql(dsn, "SELECT 1 FROM test_calls")) >= 3

            await eventually(three_running, what="three handlers running")
            await anyio.to_thread.run_sync(private_server.stop)
            await anyio.sleep(2.5)
            await anyio.to_thread.run_sync(private_server.start)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_outage)
            report = await supervisor.run()
        assert report.succeeded == 3 and report.database_outages == 1
        assert report.lease_lost == report.recovered >= 2
        losses = metrics.registry.get_sample_value("toolkit_lease_losses_total")
        assert losses == report.lease_lost
        await assert_sound_history(dsn, ids)
    warnings = toolkit_records(caplog, logging.WARNING)
    assert [r.__dict__["action"] for r in warnings] == ["database_unavailable"]
    (back,) = [r for r in caplog.records if r.__dict__.get("action") == "database_back"]
    assert back.getMessage().endswith(f"leases lost meanwhile: {report.lease_lost}")
    presumed = [r for r in caplog.records if "presumed lost" in r.getMessage()]
    assert len(presumed) == 1 and f"tasks {ids[0]}" in presumed[0].getMessage()


async def test_shutdown_during_an_outage_returns_promptly(private_server: PrivateServer) -> None:
    """With the database away, a shutdown does not wait for the pool's timeouts."""
    async with await Store.open(private_server.dsn, migrate_schema=False) as store:
        worker = Worker(store, app, [definition(THREE_STEPS)])
        supervisor = WorkflowSupervisor(worker, SupervisorConfig(**FAST))
        shutdown = CancellationToken()
        stopped_at = math.inf

        async def stop_server_then_shut_down() -> None:
            nonlocal stopped_at

            async def started() -> bool:  # the worker is registered and claiming
                return bool(await store.workers.list())

            await eventually(started, what="the worker to start")
            await anyio.to_thread.run_sync(private_server.stop)

            async def outage_seen() -> bool:
                return bool(supervisor.report.database_outages)

            await eventually(outage_seen, what="the outage")
            stopped_at = time.monotonic()
            shutdown.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_server_then_shut_down)
            report = await supervisor.run(shutdown)
        assert time.monotonic() - stopped_at < 5.0
        assert report.database_outages == 1
        private_server.start()  # for the fixture's teardown


async def test_an_engine_fault_fails_the_task_instead_of_crashing_the_worker(
    store: Store,
) -> None:
    """A checkpoint this toolkit cannot read (row surgery) fails its task cleanly."""
    bad, good = await submit(store, THREE_STEPS, [{"n": 1}, {"n": 2}])
    await sql(
        store.db.dsn,
        "UPDATE toolkit_tasks SET checkpoint = checkpoint || '{\"format\": 99}' WHERE id = %s",
        (bad,),
    )
    report = await run_until_idle(Worker(store, app, [definition(THREE_STEPS)]))
    assert report.failed == 1 and report.succeeded == 1
    failed = await store.tasks.get(bad)
    assert failed.state == "failed" and failed.error["name"] == "InternalError"
    assert "unknown checkpoint format 99" in failed.error["message"]
    assert (await store.tasks.get(good)).state == "succeeded"
