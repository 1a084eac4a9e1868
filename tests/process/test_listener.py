"""A LISTEN connection that stops delivering without closing is found and opened again
(issue 15, item 5), with a real worker process.

The listener's own server backend is SIGSTOPped: it delivers nothing and answers nothing,
yet its socket stays open, as a half-open connection behind a NAT or a failed-over proxy
does. The worker polls only once a minute here, so a task submitted then is claimed in time
only if the worker noticed, listened again and caught up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.processes import query, submit_tasks, task_events, toolkit_process, wait_for
from tests.helpers.workflows import THREE_STEPS

PROBE = 0.5


def _listener_pid(dsn: str, exclude: set[int]) -> int | None:
    rows = query(
        dsn,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'runifold'"
        " AND query IN ('LISTEN toolkit_wakeup', 'SELECT 1 AS toolkit_listen_probe')",
    )
    pids = {int(row[0]) for row in rows} - exclude  # type: ignore[call-overload]
    return pids.pop() if len(pids) == 1 else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reconnects(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("toolkit_listen_reconnects_total ")]
    return float(line.split()[1])


def test_a_listener_that_went_silent_is_reopened_and_new_work_is_claimed(
    dsn: str, tmp_path: Path
) -> None:
    definitions = tmp_path / "three.yaml"
    definitions.write_text(THREE_STEPS)
    port = _free_port()
    worker = toolkit_process(
        dsn, "run", "--app", "tests.apps.counting", "--definitions", str(definitions),
        "--worker-id", "listener", "--poll-max", "60", "--listen-probe", str(PROBE),
        "--metrics-port", str(port),
    )  # fmt: skip
    stopped: int | None = None
    try:
        wait_for(lambda: _listener_pid(dsn, set()) is not None, what="the LISTEN connection")
        stopped = _listener_pid(dsn, set())
        assert stopped is not None
        try:
            os.kill(stopped, signal.SIGSTOP)
        except PermissionError:
            pytest.skip("the server's processes are not this user's to signal")
        wait_for(
            lambda: _listener_pid(dsn, {stopped}) is not None,  # type: ignore[arg-type]
            timeout=30, what="a new LISTEN connection",
        )  # fmt: skip
        (task_id,) = submit_tasks(dsn, THREE_STEPS, [{"n": 1}])
        wait_for(
            lambda: any(e["kind"] == "claimed" for e in task_events(dsn, task_id)),
            timeout=15, what="the task to be claimed well before the next poll (60 s)",
        )  # fmt: skip
        assert _reconnects(port) >= 1
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
            query(dsn, "SELECT pg_terminate_backend(%s::integer)", (stopped,))
        worker.send_signal(signal.SIGTERM)
        try:
            _, err = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert "did not answer its probe" in err, err
    assert "Traceback" not in err, err
