"""Database faults under a real `toolkit run` process: its connections terminated mid-run, the
server restarted mid-run, a SIGTERM during an outage. Every task ends succeeded, nothing runs
twice beyond the allowed idempotent repeat, the exit status is 0 and each outage is one line."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PrivateServer
from tests.helpers.processes import query, submit_tasks, toolkit_process, wait_for, worker_report
from tests.helpers.workflows import FIVE_SLOW_STEPS

RUN = ["run", "--app", "tests.apps.counting", "--lease", "4", "--heartbeat", "0.5"]


@pytest.fixture
def definitions_file(tmp_path: Path) -> Path:
    path = tmp_path / "five-slow.yaml"
    path.write_text(FIVE_SLOW_STEPS)
    return path


_WORKER_BACKENDS = (
    "FROM pg_stat_activity WHERE application_name = 'runifold' AND datname = current_database()"
)


def worker_connections(dsn: str) -> int:
    """Connections of the toolkit's worker to this test's database."""
    return int(query(dsn, "SELECT count(*) " + _WORKER_BACKENDS)[0][0])  # type: ignore[call-overload]


def terminate_worker_connections(dsn: str) -> int:
    """``pg_terminate_backend`` every one of them; returns how many."""
    sql = "SELECT count(pg_terminate_backend(pid)) " + _WORKER_BACKENDS
    return int(query(dsn, sql)[0][0])  # type: ignore[call-overload]


def all_succeeded(dsn: str, ids: list[int]) -> bool:
    rows = query(dsn, "SELECT state FROM toolkit_tasks WHERE id = ANY(%s)", (ids,))
    return [s for (s,) in rows] == ["succeeded"] * len(ids)


def assert_nothing_ran_twice(dsn: str) -> None:
    """No occurrence completed twice; a call repeats only after a recorded failure of its key
    or a lost idempotent attempt."""
    twice = query(
        dsn,
        "SELECT task_id, occurrence FROM toolkit_effect_evidence WHERE record = 'completed' "
        "GROUP BY 1, 2 HAVING count(*) > 1",
    )
    assert twice == []
    rows = query(
        dsn,
        # (counted first, then joined to the calls: Citus joins no distributed table to a
        # local one)
        "WITH failed AS (SELECT idempotency_key AS key, count(*) AS n"
        "  FROM toolkit_effect_evidence WHERE record = 'failed' GROUP BY 1),"
        " lost AS (SELECT task_id || ':' || (detail ->> 'occurrence') AS key, count(*) AS n"
        "  FROM toolkit_task_events WHERE kind = 'attempt_lost' GROUP BY 1) "
        "SELECT c.idempotency_key, c.calls, coalesce(f.n, 0), coalesce(l.n, 0) "
        "FROM test_calls c LEFT JOIN failed f ON f.key = c.idempotency_key"
        " LEFT JOIN lost l ON l.key = c.idempotency_key",
    )
    for key, calls, failed, lost in rows:
        assert calls <= 1 + failed + lost, f"{key}: {calls} calls, {failed} failed, {lost} lost"


def stop_worker(worker: subprocess.Popen[str], log: Path | None = None) -> tuple[str, str]:
    """SIGTERM the worker; its stdout and stderr (read from ``log`` when it went there)."""
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    if log is not None:
        err = log.read_text()
    assert worker.returncode == 0, err
    assert "Traceback" not in err, err
    return out, err


def log_lines(err: str, *levels: str) -> list[str]:
    return [line for line in err.splitlines() if any(f" {level} " in line for level in levels)]


def test_terminated_connections_mid_run(dsn: str, definitions_file: Path) -> None:
    ids = submit_tasks(dsn, FIVE_SLOW_STEPS, [{"seconds": 0.2}] * 6)
    worker = toolkit_process(
        dsn, *RUN, "--definitions", str(definitions_file), "--concurrency", "6"
    )
    try:
        wait_for(lambda: bool(query(dsn, "SELECT 1 FROM test_calls")), what="handlers running")
        for _ in range(3):
            # A connection counted a moment ago may be closing (a pool being replaced after
            # the last termination, on a loaded machine): terminate until one is hit.
            wait_for(
                lambda: terminate_worker_connections(dsn) > 0, what="a worker connection to end"
            )
            wait_for(lambda: worker_connections(dsn) > 0, what="the worker to reconnect")
        wait_for(lambda: all_succeeded(dsn, ids), timeout=60, what="every task succeeded")
    finally:
        out, err = stop_worker(worker)
    assert_nothing_ran_twice(dsn)
    report = worker_report(out)
    assert report["succeeded"] == 6 and report["failed"] == 0
    # The handlers' own statements (test_calls) may be the first to meet a terminated
    # connection: their steps are retried, and the store replaces every pool of the worker
    # before its claim or group commit meets one (they run on the pool that plans once).
    assert report["database outages"] + report["retried"] >= 1, out
    assert report["database outages"] <= 3, out
    warnings = log_lines(err, "WARNING", "ERROR")
    assert len(warnings) <= report["database outages"], err
    assert all("database unavailable" in line for line in warnings), err


def test_server_restart_mid_run(private_server: PrivateServer, definitions_file: Path) -> None:
    dsn = private_server.dsn
    ids = submit_tasks(dsn, FIVE_SLOW_STEPS, [{"seconds": 0.2}] * 4)
    worker = toolkit_process(
        dsn, "--log-level", "INFO", *RUN, "--definitions", str(definitions_file),
        "--concurrency", "4", "--lease", "10",
    )  # fmt: skip
    try:
        wait_for(lambda: bool(query(dsn, "SELECT 1 FROM test_calls")), what="handlers running")
        private_server.stop()
        time.sleep(1.5)
        private_server.start()
        wait_for(lambda: all_succeeded(dsn, ids), timeout=60, what="every task succeeded")
    finally:
        out, err = stop_worker(worker)
    assert_nothing_ran_twice(dsn)
    report = worker_report(out)
    assert report["succeeded"] == 4 and report["database outages"] == 1
    warnings = log_lines(err, "WARNING", "ERROR")
    assert len(warnings) == 1 and "database unavailable" in warnings[0], err
    assert len([line for line in err.splitlines() if "database reachable again" in line]) == 1


def test_sigterm_during_an_outage_exits_zero_promptly(
    private_server: PrivateServer, definitions_file: Path, tmp_path: Path
) -> None:
    dsn = private_server.dsn
    submit_tasks(dsn, FIVE_SLOW_STEPS, [{"seconds": 0.2}])
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        worker = toolkit_process(dsn, *RUN, "--definitions", str(definitions_file), stderr=stderr)
    try:
        wait_for(lambda: bool(query(dsn, "SELECT 1 FROM test_calls")), what="handlers running")
        private_server.stop()
        wait_for(lambda: "database unavailable" in log.read_text(), what="the outage noticed")
        started = time.monotonic()
        out, err = stop_worker(worker, log)
        assert time.monotonic() - started < 10
    finally:
        if worker.poll() is None:
            worker.kill()
        private_server.start()
    assert worker_report(out)["database outages"] == 1
    assert len(log_lines(err, "WARNING", "ERROR")) == 1, err
