"""A handler that never gives up cannot hold a worker (issue 15, item 3), with real processes.

A sync handler that never returns (a loop of blocking sleeps, never checking
``ctx.cancelled``) is abandoned at its step's timeout or at shutdown, in a daemon thread
that does not keep the process alive. An async handler that swallows its cancellation is
given up ``--call-grace`` seconds past its step's timeout or its cancellation: its lease is
no longer renewed (the next claim fails closed for its non-idempotent effect, as after a
crash), and the process exits as documented after one signal, status 0.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.processes import query, submit_tasks, task_row, toolkit_process, wait_for

TIMINGS = ["--lease", "3", "--heartbeat", "1", "--grace", "1", "--call-grace", "1"]


def _definition(name: str, handler: str, *, timeout: str | None, idempotent: bool) -> str:
    limit = f"\n    timeout: {timeout}" if timeout else ""
    return f"""
name: {name}
version: 1
start: call
steps:
  call:
    effect: {handler}
    idempotent: {str(idempotent).lower()}
    retry: {{max_attempts: 1}}{limit}
"""


def _worker(dsn: str, tmp_path: Path, text: str, *extra: str) -> subprocess.Popen[str]:
    path = tmp_path / "stuck.yaml"
    path.write_text(text)
    return toolkit_process(
        dsn, "run", "--app", "tests.apps.scenarios", "--definitions", str(path), *TIMINGS,
        *extra,
    )  # fmt: skip


def _called(dsn: str) -> bool:
    return bool(query(dsn, "SELECT 1 FROM test_calls"))


def _finish(worker: subprocess.Popen[str], seconds: float) -> tuple[int, str, str]:
    try:
        out, err = worker.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        worker.kill()
        out, err = worker.communicate()
        raise AssertionError(f"the worker did not exit within {seconds:g} s:\n{err}") from None
    return worker.returncode, out, err


def test_a_sync_handler_that_never_returns_times_out_and_the_worker_exits(
    dsn: str, tmp_path: Path
) -> None:
    text = _definition("never-sync", "scn.never_returns", timeout="2s", idempotent=True)
    (task_id,) = submit_tasks(dsn, text, [{}])
    code, _, err = _finish(_worker(dsn, tmp_path, text, "--until-idle"), 30)
    assert code == 0, err
    row = task_row(dsn, task_id)
    assert (row["state"], row["error"]["name"]) == ("failed", "Timeout"), row
    assert "Traceback" not in err


def test_a_sync_handler_that_never_returns_does_not_hold_up_a_shutdown(
    dsn: str, tmp_path: Path
) -> None:
    text = _definition("never-sync-long", "scn.never_returns", timeout=None, idempotent=True)
    (task_id,) = submit_tasks(dsn, text, [{}])
    worker = _worker(dsn, tmp_path, text)
    wait_for(lambda: _called(dsn), what="the handler to be called")
    worker.send_signal(signal.SIGTERM)
    code, _, err = _finish(worker, 20)
    assert code == 0, err
    assert task_row(dsn, task_id)["state"] == "queued"  # released by the stopping worker
    assert "Traceback" not in err


@pytest.mark.parametrize("signalled", [False, True], ids=["at-its-timeout", "at-shutdown"])
def test_an_async_handler_that_swallows_cancellation_is_given_up(
    dsn: str, tmp_path: Path, signalled: bool
) -> None:
    timeout = None if signalled else "2s"
    text = _definition("stubborn", "scn.ignores_cancellation", timeout=timeout,
                       idempotent=False)  # fmt: skip
    (task_id,) = submit_tasks(dsn, text, [{}])
    worker = _worker(dsn, tmp_path, text, *([] if signalled else ["--until-idle"]))
    if signalled:
        wait_for(lambda: _called(dsn), what="the handler to be called")
        worker.send_signal(signal.SIGTERM)
    code, out, err = _finish(worker, 40)
    assert code == 0, err
    assert "gave up the cycle of task" in err and "ignored their cancellation" in err, err
    assert "Traceback" not in err
    assert "worker " in out  # the report
    if not signalled:
        # Its lease lapsed; claimed again, the uncertain non-idempotent call fails closed.
        row = task_row(dsn, task_id)
        assert (row["state"], row["wait_reason"]) == ("waiting", "reconciliation"), row
