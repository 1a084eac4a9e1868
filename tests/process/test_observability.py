"""Observability of a real `toolkit run` process: metrics over HTTP during a run, and JSON
logs with a stable action key."""

from __future__ import annotations

import json
import re
import signal
import socket
import urllib.request
from pathlib import Path

from tests.helpers.processes import query, submit_tasks, toolkit_process, wait_for
from tests.helpers.workflows import SLOW


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def _value(text: str, metric: str) -> float:
    match = re.search(rf"^{re.escape(metric)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_metrics_endpoint_shows_queue_delay_execution_time_and_a_forced_lease_loss(
    dsn: str, tmp_path: Path
) -> None:
    (task_id,) = submit_tasks(dsn, SLOW, [{}])
    query(dsn, "INSERT INTO toolkit_tenants (tenant, paused) VALUES ('held', true) RETURNING 1")
    submit_tasks(dsn, SLOW, [{}], tenant="held")
    path = tmp_path / "slow.yaml"
    path.write_text(SLOW)
    port = _free_port()
    worker = toolkit_process(
        dsn, "run", "--app", "tests.apps.counting", "--definitions", str(path),
        "--lease", "3", "--heartbeat", "0.5", "--metrics-port", str(port), "--worker-id", "m",
    )  # fmt: skip
    try:
        wait_for(lambda: query(dsn, "SELECT count(*) FROM test_calls")[0][0] == 2, what="slow step")
        # Forced takeover: the lease expires by row surgery and another claimer takes it.
        query(
            dsn,
            "UPDATE toolkit_tasks SET state = 'leased', lease_owner = 'intruder', "
            "lease_token = lease_token + 1,"
            " lease_expires_at = statement_timestamp() + interval '1 h' "
            "WHERE id = %s RETURNING id",
            (task_id,),
        )
        wait_for(lambda: _value(_scrape(port), "toolkit_lease_losses_total") >= 1, what="loss")
        text = _scrape(port)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    assert _value(text, "toolkit_queue_delay_seconds_count") >= 1
    assert _value(text, "toolkit_queue_delay_seconds_sum") > 0
    assert _value(text, "toolkit_step_duration_seconds_count") >= 1
    assert _value(text, "toolkit_lease_losses_total") == 1
    assert "toolkit_db_pool_wait_seconds_total" in text
    assert "toolkit_event_loop_lag_seconds_bucket" in text
    assert _value(text, "toolkit_cycles_in_flight") == 0
    assert 'toolkit_tasks_held{definition="slow-metrics",reason="tenant_paused"} 1.0' in text, text


def test_json_logs_carry_a_stable_action_key(dsn: str, tmp_path: Path) -> None:
    text = SLOW.replace("args: {seconds: 30}", "args: {seconds: 0}")
    submit_tasks(dsn, text, [{}])
    path = tmp_path / "quick.yaml"
    path.write_text(text)
    worker = toolkit_process(
        dsn, "--log-format", "json", "--log-level", "INFO", "run", "--app", "tests.apps.counting",
        "--definitions", str(path), "--until-idle",
    )  # fmt: skip
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    actions = {r.get("action") for r in records}
    assert {"worker_start", "worker_stop"} <= actions
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
