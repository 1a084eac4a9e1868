"""A crash in the middle of a saga's compensation: real worker processes, SIGKILL.

The compensation in flight at the kill is resumed by another worker; the one that had
finished is never run again (per-handler call counts in ``test_calls``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.processes import (
    backdate_leases,
    call_counts,
    submit_tasks,
    task_events,
    task_row,
    toolkit_process,
    wait_for,
)

RUN = ["run", "--app", "tests.apps.scenarios", "--lease", "2", "--heartbeat", "0.5"]

SAGA = """
name: crash-saga
version: 1
start: reserve
steps:
  reserve:
    effect: scn.work
    idempotent: true
    compensate: {effect: scn.slow_first_call, args: {seconds: 60}}
    next: charge
  charge:
    effect: scn.work
    idempotent: false
    compensate: {effect: scn.work, args: {value: refund}, idempotent: false}
    next: ship
  ship: {fail: {error: NoCourier, compensate: true}}
"""


def _worker(dsn: str, tmp_path: Path, worker_id: str, *extra: str) -> subprocess.Popen[str]:
    path = tmp_path / "saga.yaml"
    path.write_text(SAGA)
    return toolkit_process(dsn, *RUN, "--definitions", str(path), "--worker-id", worker_id, *extra)


def test_a_crash_mid_compensation_resumes_it_and_never_repeats_a_finished_one(
    dsn: str, tmp_path: Path
) -> None:
    (task_id,) = submit_tasks(dsn, SAGA, [{}])
    refund = f"{task_id}:compensate/charge#1/charge#1"
    release = f"{task_id}:compensate/reserve#1/reserve#1"
    first = _worker(dsn, tmp_path, "w1")
    try:
        wait_for(lambda: release in call_counts(dsn), timeout=20, what="the second compensation")
    finally:
        first.kill()
        first.communicate(timeout=10)
    assert call_counts(dsn)[refund] == 1
    backdate_leases(dsn, [task_id])
    second = _worker(dsn, tmp_path, "w2", "--until-idle")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0 and "Traceback" not in err, err
    row = task_row(dsn, task_id)
    assert row["state"] == "failed", row
    assert row["error"]["name"] == "NoCourier" and row["error"]["compensation"] == "completed"
    assert [c["step"] for c in row["result"]["compensations"]] == ["charge", "reserve"]
    counts = call_counts(dsn)
    assert counts[refund] == 1  # finished before the kill: never repeated
    assert counts[release] == 2  # in flight at the kill: resumed (it is idempotent)
    assert counts[f"{task_id}:charge#1"] == 1
    kinds = [e["kind"] for e in task_events(dsn, task_id)]
    assert kinds.count("compensated") == 2 and kinds.count("compensating") == 1
