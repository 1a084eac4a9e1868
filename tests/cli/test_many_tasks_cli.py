"""`toolkit tasks` filters and pages, `toolkit bulk` previews and applies plans, and
`toolkit wait` / `submit --wait` print a result with exit statuses of their own."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli.test_cli import UNREACHABLE, invoke

HOLD = """
name: hold
version: 1
input: {type: object, properties: {customer: {type: string}}}
tags: {customer: "${ input.customer }"}
start: hold
steps:
  hold: {wait: {signal: go}, next: route}
  route:
    choice:
      - when: "${ steps.hold.fail }"
        next: broken
    default: done
  done: {succeed: {output: {ok: true}}}
  broken: {fail: {error: Refused, message: refused}}
"""


@pytest.fixture
def hold(tmp_path: Path) -> Path:
    path = tmp_path / "hold.yaml"
    path.write_text(HOLD)
    return path


def _submit(dsn: str, customer: str, *tags: str) -> int:
    args = ["submit", "hold", "--input", json.dumps({"customer": customer})]
    for tag in tags:
        args += ["--tag", tag]
    code, out, err = invoke(*args, dsn=dsn)
    assert code == 0, err
    return int(out)


def _run(dsn: str, hold: Path) -> None:
    code, _, err = invoke(
        "run", "--app", "tests.apps.counting", "--definitions", str(hold), "--until-idle", dsn=dsn
    )
    assert code == 0, err


def test_tasks_filters_by_tag_pages_and_counts(dsn: str, hold: Path) -> None:
    assert invoke("deploy", str(hold), dsn=dsn)[0] == 0
    acme = [_submit(dsn, "acme", "region=eu") for _ in range(5)]
    _submit(dsn, "globex", "region=eu")
    code, out, _ = invoke("tasks", "--tag", "customer=acme", "--limit", "2", dsn=dsn)
    assert code == 0
    assert f"2 of 5 tasks matching --tag customer=acme; next page: --before {acme[3]}" in out
    code, out, _ = invoke(
        "tasks", "--tag", "customer=acme", "--limit", "2", "--before", str(acme[3]), dsn=dsn
    )
    assert [int(line.split()[0]) for line in out.splitlines()[1:-1]] == [acme[2], acme[1]]
    code, out, _ = invoke("tasks", "--tag", "customer=acme", "--all", "--limit", "2", dsn=dsn)
    assert [int(line.split()[0]) for line in out.splitlines()[1:-1]] == acme[::-1]
    assert "\n5 tasks matching --tag customer=acme\n" in out
    assert invoke("tasks", "--count", "--tag", "region=eu", dsn=dsn)[1].strip() == "6"
    code, out, _ = invoke(
        "tasks", "--tag", "region=eu", "--tag", "customer=globex", "--json", dsn=dsn
    )
    assert [t["tags"] for t in json.loads(out)] == [{"customer": "globex", "region": "eu"}]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tag", "customer"], "error: --tag customer: expected KEY=VALUE, e.g. customer=acme"),
        (["--created-since", "yesterday"], "error: --created-since 'yesterday' is neither a time"),
        (["--definition", "orders@two"], "error: --definition 'orders@two': expected NAME or"),
        (["--tag", "bad key=x"], "error: --tag: tag key 'bad key' is not one"),
    ],
)
def test_a_bad_filter_option_is_one_line_naming_it(args: list[str], message: str) -> None:
    code, out, err = invoke("tasks", *args, dsn=UNREACHABLE)
    assert (code, out) == (1, "")
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_state_is_a_usage_error() -> None:
    code, _, err = invoke("bulk", "cancel", "--state", "running", dsn=UNREACHABLE)
    assert code == 2 and "'running' is not one of" in err


def test_bulk_previews_a_plan_then_applies_it_once(dsn: str, hold: Path) -> None:
    assert invoke("deploy", str(hold), dsn=dsn)[0] == 0
    ids = [_submit(dsn, "acme") for _ in range(3)]
    _run(dsn, hold)
    code, out, err = invoke("bulk", "signal", "go", "--tag", "customer=acme", dsn=dsn)
    assert code == 0, err
    assert "3 tasks match (--tag customer=acme)" in out
    assert re.search(r"waiting\s+hold v1\s+3", out), out
    assert "get signal 'go', those waiting for it wake at once: 3 waiting tasks" in out
    plan = re.search(r"plan (\d+) kept: `toolkit bulk apply \1`", out)
    assert plan, out
    assert invoke("tasks", "--count", dsn=dsn)[1].strip() == "3"
    code, out, err = invoke("bulk", "apply", plan[1], dsn=dsn)
    assert (code, out.strip()) == (0, f"plan {plan[1]} applied: 3 acted on"), err
    code, out, err = invoke("bulk", "apply", plan[1], dsn=dsn)
    assert code == 1 and f"error: bulk plan {plan[1]} was applied already" in err
    code, out, err = invoke("bulk", "show", plan[1], dsn=dsn)
    assert "signal by " in out and "3 tasks; 3 acted on" in out
    assert 'filter:   {"tags": {"customer": "acme"}}' in out, out  # JSON, not a Python dict
    _run(dsn, hold)
    code, out, _ = invoke("tasks", "--state", "succeeded", "--count", dsn=dsn)
    assert out.strip() == str(len(ids))
    code, _, err = invoke("bulk", "apply", "99", dsn=dsn)
    assert (code, err.strip()) == (1, "error: there is no bulk plan 99")


def test_bulk_cancel_with_yes_applies_at_once(dsn: str, hold: Path) -> None:
    assert invoke("deploy", str(hold), dsn=dsn)[0] == 0
    for _ in range(2):
        _submit(dsn, "acme")
    code, out, err = invoke("bulk", "cancel", "--state", "queued", "--yes", dsn=dsn)
    assert code == 0, err
    assert "cancelled at once: 2 queued or waiting tasks" in out
    assert re.search(r"plan \d+ applied: 2 acted on", out), out
    assert invoke("tasks", "--state", "cancelled", "--count", dsn=dsn)[1].strip() == "2"
    # A preview's examples are tasks it acts on, not the ended ones its filter also matched.
    queued = _submit(dsn, "acme")
    code, out, err = invoke("bulk", "cancel", "--tag", "customer=acme", dsn=dsn)
    assert code == 0, err
    assert "3 tasks match" in out and "1 of them" in out, out
    examples = re.findall(r"e\.g\. task (\d+): (\w+)", out)
    assert examples == [(str(queued), "queued")], out


def test_wait_prints_the_output_or_the_error_with_its_exit_status(dsn: str, hold: Path) -> None:
    assert invoke("deploy", str(hold), dsn=dsn)[0] == 0
    ok, failing, cancelled, waiting = (_submit(dsn, "acme") for _ in range(4))
    _run(dsn, hold)
    assert invoke("signal", str(ok), "go", "--payload", "{}", dsn=dsn)[0] == 0
    assert invoke("signal", str(failing), "go", "--payload", '{"fail": true}', dsn=dsn)[0] == 0
    assert invoke("cancel", str(cancelled), dsn=dsn)[0] == 0
    _run(dsn, hold)
    code, out, _ = invoke("wait", str(ok), dsn=dsn)
    assert (code, json.loads(out)) == (0, {"ok": True})
    code, out, err = invoke("wait", str(failing), dsn=dsn)
    assert code == 3 and json.loads(out)["name"] == "Refused"
    assert err.startswith(f"error: task {failing} failed at step broken: Refused: refused")
    code, out, err = invoke("wait", str(cancelled), dsn=dsn)
    assert code == 4 and json.loads(out)["name"] == "Cancelled"
    code, out, err = invoke("wait", str(waiting), "--timeout", "200ms", dsn=dsn)
    assert (code, out) == (5, "") and "after 0.2 s of waiting; it goes on" in err
    code, out, err = invoke(
        "submit", "hold", "--input", "{}", "--wait", "--wait-timeout", "100ms", dsn=dsn
    )
    assert code == 5 and re.match(r"task \d+ submitted; waiting for it to end", err), err
    code, _, err = invoke("submit", "hold", "--wait-timeout", "1s", dsn=UNREACHABLE)
    assert (code, err.strip()) == (1, "error: --wait-timeout goes with --wait")
