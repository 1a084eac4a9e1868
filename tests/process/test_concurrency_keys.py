"""Concurrency keys (docs/flow-control.md) over real ``toolkit run`` workers: four processes of
concurrency 8, 40 keys of 10 tasks each. What the handlers recorded (``test_limit_calls``,
database times) is checked, never what the store says of itself: no two calls of one key
overlap, and each key's tasks ran in submission order."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import psycopg

from tests.apps.limited import CREATE_TABLES
from tests.helpers.processes import query, submit_tasks, wait_for
from tests.process.test_limits import start_workers, states, stop_workers

KEYED = """
name: keyed-free
version: 1
input: {type: object}
concurrency: {key: "${ input.account }", max_active: 1}
start: call
steps:
  call:
    effect: lim.free
    idempotent: true
    args: {limit: free, seconds: "${ input.seconds }"}
"""


def test_one_key_never_runs_twice_at_once_and_keeps_submission_order(
    dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CREATE_TABLES)
    (tmp_path / "keyed.yaml").write_text(KEYED)
    inputs = [{"account": f"acct-{k}", "seconds": 0.01} for _ in range(10) for k in range(40)]
    workers = start_workers(dsn, tmp_path, 4, "--concurrency", "8")
    try:
        ids = submit_tasks(dsn, KEYED, inputs)
        wait_for(
            lambda: states(dsn, ids) == {"succeeded": 400},
            timeout=120,
            what=f"400 keyed tasks (now {states(dsn, ids)})",
        )
    finally:
        outputs = stop_workers(workers)
    assert all("Traceback" not in out for out in outputs), outputs
    rows = query(
        dsn,
        "SELECT t.input ->> 'account', c.task_id, c.started_at, c.ended_at"
        " FROM test_limit_calls c JOIN toolkit_tasks t ON t.id = c.task_id"
        " ORDER BY c.started_at",
    )
    by_key: dict[str, list[tuple[int, object, object]]] = defaultdict(list)
    for key, task_id, started, ended in rows:
        by_key[str(key)].append((int(task_id), started, ended))  # type: ignore[call-overload]
    assert len(by_key) == 40 and all(len(calls) == 10 for calls in by_key.values()), by_key
    for key, calls in by_key.items():
        for (_, _, ended), (task_id, started, _) in itertools.pairwise(calls):
            assert ended is not None and ended <= started, (key, task_id, calls)
        assert [task for task, _, _ in calls] == sorted(task for task, _, _ in calls), (key, calls)
