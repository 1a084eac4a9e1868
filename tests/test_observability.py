"""Metrics over HTTP during a real run, and `toolkit doctor` flagging what needs action."""

from __future__ import annotations

import json
import re
import signal
import socket
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from tests.processes import query, submit_tasks, toolkit_process, wait_for
from toolkit.cli import cli

SLOW = """
name: slow-metrics
version: 1
input: {type: object}
start: quick
steps:
  quick: {effect: count.work, idempotent: true, next: slow}
  slow: {effect: count.work, idempotent: true, args: {seconds: 30}}
"""


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
            "lease_token = lease_token + 1, lease_expires_at = clock_timestamp() + interval '1 h' "
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


def test_doctor_flags_an_expired_lease_and_an_unavailable_definition(dsn: str) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["doctor"], env={"TOOLKIT_DSN": dsn})
    assert result.exit_code == 0, result.output
    (task_id,) = submit_tasks(dsn, SLOW, [{}])
    query(
        dsn,
        "UPDATE toolkit_tasks SET state = 'leased', lease_owner = 'gone', lease_token = 1, "
        "lease_expires_at = clock_timestamp() - interval '1 minute' WHERE id = %s RETURNING id",
        (task_id,),
    )
    result = runner.invoke(cli, ["doctor", "--json"], env={"TOOLKIT_DSN": dsn})
    assert result.exit_code == 1
    findings = {f["check"]: f for f in json.loads(result.stdout)}
    assert findings["expired_leases"]["level"] == "action"
    assert findings["expired_leases"]["value"] == 1
    assert findings["definition_unavailable"]["value"] == {"slow-metrics v1": 1}
    assert findings["schema"]["level"] == "ok" and findings["clock_offset"]["level"] == "ok"
    text = runner.invoke(cli, ["doctor"], env={"TOOLKIT_DSN": dsn}).stdout
    assert "FIX  expired_leases" in text and "slow-metrics v1 (1)" in text


def test_doctor_judges_the_oldest_due_task_of_tenants_that_are_not_paused(dsn: str) -> None:
    (task_id,) = submit_tasks(dsn, SLOW, [{}])
    query(
        dsn,
        "UPDATE toolkit_tasks SET run_at = clock_timestamp() - interval '1 hour' WHERE id = %s"
        " RETURNING tenant",
        (task_id,),
    )
    result = CliRunner().invoke(cli, ["doctor", "--json"], env={"TOOLKIT_DSN": dsn})
    oldest = {f["check"]: f for f in json.loads(result.stdout)}["oldest_queued"]
    assert oldest["level"] == "warning" and oldest["value"] > 3500
    query(dsn, "UPDATE toolkit_tenants SET paused = true RETURNING tenant")
    result = CliRunner().invoke(cli, ["doctor", "--json"], env={"TOOLKIT_DSN": dsn})
    oldest = {f["check"]: f for f in json.loads(result.stdout)}["oldest_queued"]
    assert (oldest["level"], oldest["value"]) == ("ok", None)  # no worker may claim it


def test_doctor_on_an_unreachable_database_never_shows_the_password() -> None:
    result = CliRunner().invoke(
        cli,
        ["doctor"],
        env={"TOOLKIT_DSN": "postgresql://u:sesame@127.0.0.1:1/x?connect_timeout=1"},
    )
    assert result.exit_code == 1
    assert "cannot reach PostgreSQL" in result.stdout and "sesame" not in result.output


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
