"""`toolkit doctor` flagging what needs action (``toolkit.ops.doctor``)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.helpers.processes import query, submit_tasks
from tests.helpers.workflows import SLOW
from toolkit.cli import cli


def test_doctor_flags_an_expired_lease_and_an_unavailable_definition(dsn: str) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["doctor"], env={"TOOLKIT_DSN": dsn})
    assert result.exit_code == 0, result.output
    (task_id,) = submit_tasks(dsn, SLOW, [{}])
    query(
        dsn,
        "UPDATE toolkit_tasks SET state = 'leased', lease_owner = 'gone', lease_token = 1, "
        "lease_expires_at = statement_timestamp() - interval '1 minute' WHERE id = %s RETURNING id",
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
        "UPDATE toolkit_tasks SET run_at = statement_timestamp() - interval '1 hour' WHERE id = %s"
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


def test_doctor_names_the_hottest_concurrency_keys(dsn: str) -> None:
    keyed = SLOW.replace(
        "name: slow-metrics", 'name: slow-keyed\nconcurrency: {key: "${ input.k }"}'
    )
    submit_tasks(dsn, keyed, [{"k": "hot"}] * 3 + [{"k": "cold"}])
    result = CliRunner().invoke(cli, ["doctor", "--json"], env={"TOOLKIT_DSN": dsn})
    keys = {f["check"]: f for f in json.loads(result.stdout)}["concurrency_keys"]
    # the first of each key holds it (admitted at submit): the others wait, hot first
    assert [(v["key"], v["waiting"]) for v in keys["value"]] == [("hot", 2)], keys
    assert keys["level"] == "ok"
    assert "slow-keyed 'hot' (tenant default): 2 waiting" in keys["message"]


def test_doctor_names_the_hottest_tenants(dsn: str) -> None:
    submit_tasks(dsn, SLOW, [{}] * 3, tenant="hot")
    submit_tasks(dsn, SLOW, [{}], tenant="cold")
    result = CliRunner().invoke(cli, ["doctor", "--json"], env={"TOOLKIT_DSN": dsn})
    tenants = {f["check"]: f for f in json.loads(result.stdout)}["tenants"]
    assert [(v["tenant"], v["due"], v["active"]) for v in tenants["value"]] == [
        ("hot", 3, 0), ("cold", 1, 0),
    ], tenants  # fmt: skip
    assert tenants["level"] == "ok" and "hot: 3 due" in tenants["message"], tenants
