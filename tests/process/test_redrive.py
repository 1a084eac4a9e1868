"""A redrive is fenced like a claim: a worker SIGSTOPped past its lease, continued after the
task was cancelled and redriven, can never commit (issue 19)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import anyio

from tests.helpers.processes import call_counts, query, submit_tasks, toolkit_process, wait_for
from toolkit.history.audit import audit_task
from toolkit.store import Store

SLOW = """
name: slow-once
version: 1
start: one
steps:
  one: {effect: count.work, idempotent: true, args: {seconds: 6}, next: done}
  done: {succeed: {output: "${ steps.one.step }"}}
"""


def test_a_stale_worker_cannot_commit_after_a_redrive(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text(SLOW)
    (task_id,) = submit_tasks(dsn, SLOW, [{}])
    run = ["run", "--app", "tests.apps.counting", "--definitions", str(path)]
    run += ["--lease", "2", "--heartbeat", "0.5", "--grace", "0.5"]
    stale = toolkit_process(dsn, *run, "--worker-id", "stale")
    try:
        wait_for(lambda: f"{task_id}:one#1" in call_counts(dsn), what="the handler started")
        stale.send_signal(signal.SIGSTOP)
        wait_for(
            lambda: bool(query(dsn, "SELECT lease_expires_at < clock_timestamp() FROM"
                               " toolkit_tasks WHERE id = %s", (task_id,))[0][0]),
            what="the stopped worker's lease expired",
        )  # fmt: skip

        async def cancel_and_redrive() -> int:
            async with await Store.open(dsn, migrate_schema=False) as store:
                assert await store.tasks.cancel(task_id, "stuck worker") == "cancelled"
                await store.tasks.redrive(task_id, reason="worker was stuck")
                return (await store.tasks.get(task_id)).lease_token

        token = anyio.run(cancel_and_redrive)
        stale.send_signal(signal.SIGCONT)
        # Continued, it finds its lease gone; the redriven task is claimed anew (by it or
        # not: either way under a token above the redrive's).
        wait_for(lambda: _claimed_after(dsn, task_id, token), what="a claim after the redrive")
    finally:
        stale.send_signal(signal.SIGCONT)
        stale.send_signal(signal.SIGTERM)
        out, err = stale.communicate(timeout=60)
    assert re.search(r"lease(\(s\))? lost", out + err), out + err
    finisher = toolkit_process(dsn, *run, "--worker-id", "finisher", "--until-idle")
    _, ferr = finisher.communicate(timeout=90)
    assert finisher.returncode == 0, ferr

    async def outcome() -> tuple[str, list[object]]:
        async with await Store.open(dsn, migrate_schema=False) as store:
            task = await store.tasks.get(task_id)
            return task.state, list(await audit_task(store, task_id))

    state, violations = anyio.run(outcome)
    # no record under the stale token after the redrive (stale_token_commit), none skipped
    assert violations == [], violations
    assert state == "succeeded", query(
        dsn, "SELECT kind, worker_id, fencing_token, detail FROM toolkit_task_events"
        " WHERE task_id = %s ORDER BY id", (task_id,),
    )  # fmt: skip


def _claimed_after(dsn: str, task_id: int, token: int) -> bool:
    rows = query(
        dsn, "SELECT count(*) FROM toolkit_task_events WHERE task_id = %s"
        " AND kind IN ('claimed', 'recovered') AND fencing_token > %s", (task_id, token),
    )  # fmt: skip
    return bool(rows[0][0])
