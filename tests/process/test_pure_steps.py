"""A loop of pure steps cannot starve a worker (issue 15, item 2), with real processes.

Pure steps (``choice``, ``set``, ``succeed``, ``fail``) need no write each (DESIGN §4), but
a run of them yields to the event loop every few milliseconds and commits its progress at
each heartbeat interval: the worker's heartbeats keep its lease, a SIGTERM stops it, and
``max_steps`` ends a loop that never exits. A task whose leases keep lapsing at a pure step
without a step finishing (a step that crashes every worker that runs it) fails
``LeasesLapsed`` after a bounded number of lapses.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.processes import (
    backdate_leases,
    submit_tasks,
    task_diagnosis,
    task_events,
    task_row,
    toolkit_process,
    wait_for,
)
from toolkit.engine.task import MAX_LAPSES
from toolkit.faults import FAULT_EXIT_CODE, PURE_STEP

TIMINGS = ["--lease", "3", "--heartbeat", "1", "--grace", "2"]


def _loop(max_steps: int) -> str:
    return f"""
name: pure-loop
version: 1
max_steps: {max_steps}
start: ping
steps:
  ping:
    choice:
      - when: "${{ input.stop }}"
        next: done
    default: pong
  pong:
    choice:
      - when: "${{ input.stop }}"
        next: done
    default: ping
  done:
    succeed: {{}}
"""


def _worker(dsn: str, tmp_path: Path, text: str, *extra: str) -> subprocess.Popen[str]:
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    return toolkit_process(
        dsn, "run", "--app", "tests.apps.counting", "--definitions", str(path), *TIMINGS,
        *extra,
    )  # fmt: skip


def _stop(*workers: subprocess.Popen[str]) -> list[str]:
    errors = []
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            errors.append(worker.communicate(timeout=20)[1])
        except subprocess.TimeoutExpired:
            worker.kill()
            errors.append(worker.communicate()[1] + "\n(did not stop within 20 s)")
    return errors


def test_max_steps_ends_a_loop_of_pure_steps_without_a_lease_lapsing(
    dsn: str, tmp_path: Path
) -> None:
    # Two workers, a lease of 3 s: a loop that ran unpaced for longer lost its lease to the
    # other worker again and again, each starting over from the last committed step count.
    text = _loop(max_steps=1_000_000)
    (task_id,) = submit_tasks(dsn, text, [{"stop": False}])
    workers = [_worker(dsn, tmp_path, text, "--worker-id", f"pure-{n}") for n in (1, 2)]
    try:
        wait_for(
            lambda: task_row(dsn, task_id)["state"] == "failed",
            timeout=120, what="the loop to reach max_steps",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {task_diagnosis(dsn, task_id)}\n{_stop(*workers)}") from None
    errors = _stop(*workers)
    row = task_row(dsn, task_id)
    assert row["error"]["name"] == "MaxStepsExceeded", task_diagnosis(dsn, task_id)
    kinds = [event["kind"] for event in task_events(dsn, task_id)]
    assert kinds.count("claimed") == 1 and "recovered" not in kinds, (kinds, errors)
    assert [worker.returncode for worker in workers] == [0, 0], errors


def test_a_loop_of_pure_steps_commits_its_progress_and_stops_at_sigterm(
    dsn: str, tmp_path: Path
) -> None:
    text = _loop(max_steps=1_000_000_000)
    (task_id,) = submit_tasks(dsn, text, [{"stop": False}])
    worker = _worker(dsn, tmp_path, text)
    try:
        wait_for(
            lambda: task_row(dsn, task_id)["checkpoint"].get("steps_run", 0) > 0,
            timeout=30, what="a progress commit of the loop",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {task_diagnosis(dsn, task_id)}\n{_stop(worker)}") from None
    worker.send_signal(signal.SIGTERM)
    try:
        _, err = worker.communicate(timeout=15)  # --grace 2, then the cycle is cancelled
    except subprocess.TimeoutExpired:
        worker.kill()
        raise AssertionError(f"SIGTERM was not honoured: {worker.communicate()[1]}") from None
    assert worker.returncode == 0, err
    # the operator is told what the first signal does (it printed nothing before)
    assert "stopping: no more claims; the cycles running get up to 2 s" in err, err
    row = task_row(dsn, task_id)
    assert row["state"] == "queued", task_diagnosis(dsn, task_id)  # released, progress kept
    assert row["checkpoint"]["steps_run"] > 0
    assert "released" in [event["kind"] for event in task_events(dsn, task_id)]


def test_a_pure_step_that_crashes_every_worker_fails_its_task_after_a_bounded_count(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLKIT_FAULT_POINT", PURE_STEP)
    monkeypatch.setenv("TOOLKIT_FAULT_STEP", "pong")
    text = _loop(max_steps=1000)
    (task_id,) = submit_tasks(dsn, text, [{"stop": False}])
    crashes = 0
    while task_row(dsn, task_id)["state"] not in ("failed", "succeeded"):
        assert crashes <= MAX_LAPSES, task_diagnosis(dsn, task_id)
        worker = _worker(dsn, tmp_path, text, "--until-idle")
        _, err = worker.communicate(timeout=60)
        if worker.returncode == FAULT_EXIT_CODE:
            crashes += 1
            assert backdate_leases(dsn, [task_id]) == 1, task_diagnosis(dsn, task_id)
        else:
            assert worker.returncode == 0, err
    row = task_row(dsn, task_id)
    assert row["state"] == "failed" and row["error"]["name"] == "LeasesLapsed", task_diagnosis(
        dsn, task_id
    )
    assert f"{MAX_LAPSES} times in a row at step 'ping'" in row["error"]["message"], row
    # The first claim crashed unrecovered; each takeover after it counts one lapse.
    assert crashes == MAX_LAPSES, task_diagnosis(dsn, task_id)

