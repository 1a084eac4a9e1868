"""Helpers of the in-process database-fault tests (runtime, store and engine): a
supervisor configuration with a short lease, statements on a connection of the test's own,
terminating the worker's connections, and the check that a history is sound."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker

FAST = dict(lease=3.0, heartbeat=0.3, idle_backoff_min=0.01, idle_backoff_max=0.2)


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
