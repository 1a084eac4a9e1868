"""Helpers to run real ``toolkit`` worker processes and wait on store conditions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import psycopg

from tests.helpers.workflows import definition
from toolkit.store import Store

REPO = Path(__file__).resolve().parents[2]


def toolkit_process(dsn: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    """Start ``python -m toolkit ARGS`` against ``dsn`` with the tests' apps importable.

    Its stdout and stderr are pipes unless ``kwargs`` (passed to `subprocess.Popen`) say
    otherwise; ``env`` in them adds variables to this process's environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit", *args],
        env=toolkit_env(dsn, kwargs.pop("env", {})),  # type: ignore[arg-type]
        cwd=REPO,
        text=True,
        **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs},  # type: ignore[arg-type]
    )


def toolkit_env(dsn: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a toolkit process: this one's, ``extra``, the store, the apps."""
    return {
        **os.environ,
        **(extra or {}),
        "TOOLKIT_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def wait_for(
    condition: Callable[[], bool],
    *,
    timeout: float = 30.0,
    what: str | Callable[[], str] = "condition",
) -> None:
    """Poll a store condition until it holds, failing the test past ``timeout`` seconds.

    ``what`` says what was awaited; a callable is asked at the timeout (the state then).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    said = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout:g} s waiting for {said}")


def query(dsn: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def call_counts(dsn: str) -> dict[str, int]:
    if not query(dsn, "SELECT to_regclass('test_calls')")[0][0]:
        return {}
    return {str(k): int(v) for k, v in query(dsn, "SELECT idempotency_key, calls FROM test_calls")}  # type: ignore[call-overload]


# --- helpers of the crash-matrix and acceptance tests -------------------------------------------


def submit_tasks(
    dsn: str, text: str, inputs: Sequence[Any], tenant: str = "default"
) -> list[int]:
    """Deploy the definition ``text`` and submit one task per input (of ``tenant``); return
    their ids."""

    async def main() -> list[int]:
        async with await Store.open(dsn, migrate_schema=False) as store:
            d = definition(text)
            await store.definitions.deploy(d)
            return await store.tasks.submit(d, inputs, tenant=tenant)

    return anyio.run(main)


def task_row(dsn: str, task_id: int) -> dict[str, Any]:
    """The task's row as a dict (column name to value)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute("SELECT * FROM toolkit_tasks WHERE id = %s", (task_id,))
        names = [c.name for c in cursor.description or ()]
        row = cursor.fetchone()
    assert row is not None, f"no task {task_id}"
    return dict(zip(names, row, strict=True))


def task_events(dsn: str, task_id: int) -> list[dict[str, Any]]:
    """The task's events, oldest first: kind, at, worker_id, fencing_token, detail."""
    rows = query(
        dsn,
        "SELECT kind, at, worker_id, fencing_token, detail FROM toolkit_task_events "
        "WHERE task_id = %s ORDER BY id",
        (task_id,),
    )
    keys = ("kind", "at", "worker_id", "fencing_token", "detail")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def task_diagnosis(dsn: str, task_id: int) -> str:
    """What a failed assertion about a task shows: its state, wait, lease owner, error,
    checkpoint cursor and steps run, and its events (kind, worker, detail)."""
    row = task_row(dsn, task_id)
    shown = {key: row[key] for key in ("state", "wait_reason", "lease_owner", "error")}
    checkpoint = row["checkpoint"] or {}
    events = [(e["kind"], e["worker_id"], e["detail"]) for e in task_events(dsn, task_id)]
    return (
        f"task {task_id}: {shown}, cursor {checkpoint.get('cursor')}, "
        f"steps_run {checkpoint.get('steps_run')}, events {events}"
    )


def task_evidence(dsn: str, task_id: int) -> list[dict[str, Any]]:
    """The task's effect evidence, oldest first."""
    rows = query(
        dsn,
        "SELECT step, record, idempotency_key, attempt, fencing_token, worker_id, result "
        "FROM toolkit_effect_evidence WHERE task_id = %s ORDER BY id",
        (task_id,),
    )
    keys = ("step", "record", "idempotency_key", "attempt", "fencing_token", "worker_id", "result")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def backdate_leases(dsn: str, task_ids: list[int] | None = None) -> int:
    """Row surgery: expire the lease of these (default: all) leased tasks now; return count."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(
            "UPDATE toolkit_tasks SET lease_expires_at = now() - interval '1 second' "
            "WHERE state = 'leased' AND (%s::bigint[] IS NULL OR id = ANY(%s::bigint[]))",
            (task_ids, task_ids),
        )
        return cursor.rowcount


def worker_report(output: str) -> dict[str, float]:
    """Parse the ``toolkit run`` report line: ``{"claimed": 1, ..., "max loop lag": 12}``."""
    import re

    line = next(line for line in output.splitlines() if line.startswith("worker "))
    counts = line.split(": ", 1)[1]
    fields = {}
    for name, value in re.findall(r"([a-z][a-z ]*?) (\d+(?:\.\d+)?)(?: ms| s)?(?:,|$)", counts):
        fields[name.strip()] = float(value)
    return fields


async def lock_waits(conn: psycopg.AsyncConnection[Any]) -> int:
    """How many statements of ``conn``'s database wait for a lock now (one server's view)."""
    # (the statistics views keep one snapshot per transaction unless cleared)
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    row = await cursor.fetchone()
    return 0 if row is None else int(row[0])


async def eventually(
    condition: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, what: str = "condition"
) -> None:
    """Await a store condition until it holds, failing the test past ``timeout`` seconds."""
    try:
        with anyio.fail_after(timeout):
            while not await condition():
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}") from None
