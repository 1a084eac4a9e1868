"""`toolkit emit` says what an event did; `toolkit events list` shows it again."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import invoke
from tests.helpers.golden import EXAMPLES


def test_emit_starts_delivers_and_de_duplicates(dsn: str) -> None:
    definition = str(EXAMPLES / "order-events.yaml")
    assert invoke("deploy", definition, dsn=dsn)[0] == 0
    placed = json.dumps({"order_id": "o-1", "total": 30})
    code, out, err = invoke("emit", "order.placed", "--payload", placed, "--key", "p-1", dsn=dsn)
    assert code == 0, err
    assert out.splitlines() == ["event 1 emitted", "  started: task 1"], out
    code, out, err = invoke("emit", "order.placed", "--payload", placed, "--key", "p-1", dsn=dsn)
    assert out.strip() == "event 1: key 'p-1' was emitted before; nothing done again", out
    # The same order again, without an event key: its start key names the live task.
    code, out, err = invoke("emit", "order.placed", "--payload", placed, dsn=dsn)
    assert out.splitlines()[1:] == ["  delivered to: task 1"], out
    run = ["run", "--definitions", definition, "--app", "toolkit.examples", "--until-idle"]
    assert invoke(*run, dsn=dsn)[0] == 0
    code, out, _ = invoke("show", "1", dsn=dsn)
    assert "waits for:  event 'payment.settled'" in out, out
    assert "started by: event 1 (order.placed" in out, out
    paid = json.dumps({"order_id": "o-1", "amount": 30})
    code, out, err = invoke("emit", "payment.settled", "--payload", paid, dsn=dsn)
    assert out.splitlines()[1:] == ["  delivered to: task 1"], out
    settled = int(out.split()[1])
    assert invoke(*run, dsn=dsn)[0] == 0
    code, out, _ = invoke("show", "1", dsn=dsn)
    assert f"delivered:  event {settled} (payment.settled" in out, out
    code, out, _ = invoke("wait", "1", dsn=dsn)
    assert code == 0 and json.loads(out) == {"order_id": "o-1", "paid": 30}, out
    code, out, _ = invoke("emit", "payment.settled", "--payload", paid, dsn=dsn)
    assert "no trigger started a task, and no task waiting for it now matched; a task " in out
    assert "submitted before it takes it when it reaches its wait" in out, out
    code, out, _ = invoke("events", "list", "--name", "payment.settled", "--json", dsn=dsn)
    listed = [json.loads(line) for line in out.splitlines()]
    assert [(e["id"], e["delivered"]) for e in listed][1:] == [(settled, [1])], listed
    assert listed[0]["delivered"] == [] and listed[0]["id"] > settled, listed
    code, out, err = invoke("emit", "order.placed", "--payload", '{"order_id": 7, "total": 1}',
                            dsn=dsn)  # fmt: skip
    assert code == 1, err
    assert err.strip() == ("error: invalid payload of event 'order.placed' (schema of "
                           "order-events v1): $.order_id: expected string, got integer 7"), err
    assert "Traceback" not in err


def test_deploy_warns_of_a_trigger_for_an_event_nothing_knows(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(
        "name: typo\nversion: 1\ntriggers: [{event: order.placd}]\nstart: done\n"
        "steps: {done: {succeed: {}}}\n"
    )
    assert invoke("deploy", str(EXAMPLES / "order-events.yaml"), dsn=dsn)[0] == 0
    code, _, err = invoke("deploy", str(path), dsn=dsn)
    assert code == 0, err
    assert "warning: typo v1 has a trigger for event 'order.placd'" in err, err
    assert "known events: order.placed, payment.settled" in err, err
