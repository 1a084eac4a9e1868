"""The fencing audit of a history a worker process killed with SIGKILL left behind (the
audit itself: ``tests/history/test_audit.py``)."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.helpers.inprocess import deploy_submit
from tests.helpers.processes import call_counts, toolkit_process, wait_for
from tests.helpers.workflows import FIVE_SLOW_STEPS
from toolkit.history.audit import AuditReport, audit_all
from toolkit.store import Store


def test_a_worker_killed_mid_workflow_leaves_a_sound_history(dsn: str, tmp_path: Path) -> None:
    import anyio

    path = tmp_path / "five-slow.yaml"
    path.write_text(FIVE_SLOW_STEPS)

    async def submit() -> int:
        async with await Store.open(dsn, migrate_schema=False) as store:
            (task_id,) = await deploy_submit(store, FIVE_SLOW_STEPS, [{"seconds": 0.3}])
            return task_id

    task_id = anyio.run(submit)
    run = ["run", "--app", "tests.apps.counting", "--definitions", str(path)]
    run += ["--lease", "2", "--heartbeat", "0.5"]
    first = toolkit_process(dsn, *run, "--worker-id", "killed")
    try:
        wait_for(lambda: len(call_counts(dsn)) >= 3, what="three steps called")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
    second = toolkit_process(dsn, *run, "--worker-id", "finisher", "--until-idle")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err

    async def audit() -> tuple[str, AuditReport]:
        async with await Store.open(dsn, migrate_schema=False) as store:
            return (await store.tasks.get(task_id)).state, await audit_all(store)

    state, report = anyio.run(audit)
    assert state in ("succeeded", "waiting")  # waiting: s2 or s4 was in flight (reconcile)
    assert report.ok, report.violations
