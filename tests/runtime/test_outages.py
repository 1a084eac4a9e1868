"""Database faults, in-process: terminated connections, a server restart, an exhausted pool,
refused statements. The worker tries again with backoff, never crashes, never commits under a
lease it may have lost, and logs one line per outage (a cycle's own writes through a fault:
``tests/engine/test_cycle.py``; the group commit: ``tests/store/test_group_commit.py``)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import anyio
import pytest

from tests.apps.counting import app, record_call
from tests.conftest import PrivateServer
from tests.helpers.inprocess import submit
from tests.helpers.outages import (
    FAST,
    assert_sound_history,
    run_until_idle,
    sql,
    terminate_worker_connections,
    toolkit_records,
)
from tests.helpers.processes import eventually
from tests.helpers.workflows import FIVE_SLOW_STEPS, THREE_STEPS, definition
from toolkit.application import App, EffectContext
from toolkit.errors import StoreError
from toolkit.metrics import WorkerMetrics
from toolkit.runtime import listener as listener_module
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio


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

    async def refused(every: float) -> Any:
        raise StoreError("database error 42P01: relation does not exist")

    monkeypatch.setattr(store.workers, "fleet_counts", refused)
    report = await run_until_idle(Worker(store, app, [definition(THREE_STEPS)]))
    assert report.succeeded == 1


async def test_claim_loop_survives_a_refused_claim(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(store, THREE_STEPS, [{"n": 1}])
    worker = Worker(store, app, [definition(THREE_STEPS)])
    real_claim = worker.claim
    refused = 0

    async def claim(limit: int, lease: float, *, deferring: bool = False) -> Any:
        nonlocal refused
        if not refused:
            refused += 1
            raise StoreError("database error 40001: could not serialize access")
        return await real_claim(limit, lease, deferring=deferring)

    monkeypatch.setattr(worker, "claim", claim)
    report = await run_until_idle(worker, idle_backoff_max=0.05)
    assert refused == 1 and report.succeeded == 1


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
            "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() - interval '1 s' "
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
            async def outage_noticed() -> bool:
                return any(
                    r.__dict__.get("action") == "database_unavailable" for r in caplog.records
                )

            await anyio.to_thread.run_sync(private_server.stop)
            await eventually(outage_noticed, what="the worker to notice the outage")
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
async def slow_first_attempt(ctx: EffectContext, seconds: float | None = None) -> dict[str, Any]:
    """Count the call; sleep ``seconds`` (None: not at all) on the first attempt only."""
    await record_call(ctx)
    if ctx.attempt == 1 and seconds is not None:  # `${ input.seconds }` of `{}` is None
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
  # Idempotent: a non-idempotent call in flight when the server stops (task 3 reaches this
  # step in milliseconds, the stop takes longer on a loaded machine) rightly waits for
  # reconciliation, which is not what this test is about.
  once: {effect: slow.first_attempt, idempotent: true}
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
    # The line counts the leases lost during the outage. On a loaded machine a lease of a
    # task claimed again can be lost after it too (the pool's first reconnects outlast the
    # lease): the report counts that one, and a record after the line names it.
    log = [r.getMessage() for r in caplog.records]
    meanwhile = int(back.getMessage().rpartition("leases lost meanwhile: ")[2])
    assert 2 <= meanwhile <= report.lease_lost, log
    later = caplog.records[caplog.records.index(back) :]
    assert meanwhile == report.lease_lost or any(
        r.__dict__.get("action") == "lease_lost" for r in later
    ), log
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
