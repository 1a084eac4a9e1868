"""`toolkit redrive` prints its plan before acting, and a refused plan before the refusal."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import invoke

CHARGE = """
name: charge
version: 1
start: hold
steps:
  hold: {wait: {signal: go}, next: charge}
  charge: {effect: count.work, idempotent: false, args: {value: card}, next: route}
  route:
    choice:
      - when: "${ steps.hold.fail }"
        next: broken
    default: done
  done: {succeed: {output: {ok: true}}}
  broken: {fail: {error: Refused, message: refused}}
"""


def test_redrive_previews_refuses_and_acts(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "charge.yaml"
    path.write_text(CHARGE)
    run = ["run", "--app", "tests.apps.counting", "--definitions", str(path), "--until-idle"]
    assert invoke("deploy", str(path), dsn=dsn)[0] == 0
    code, out, err = invoke("submit", "charge", dsn=dsn)
    task_id = int(out)
    assert invoke(*run, dsn=dsn)[0] == 0
    assert invoke("signal", str(task_id), "go", "--payload", json.dumps({"fail": True}),
                  dsn=dsn)[0] == 0  # fmt: skip
    assert invoke(*run, dsn=dsn)[0] == 0

    code, out, err = invoke("redrive", str(task_id), "--dry-run", dsn=dsn)
    assert code == 0, err
    assert f"task {task_id} (charge v1, failed) resumes at step 'broken'" in out
    assert "charge#1 (count.work)" in out and "dry run: nothing was changed" in out
    assert "note: step 'broken' is a fail step: resumed there, the task fails again" in out

    code, out, err = invoke("redrive", str(task_id), "--from", "hold", dsn=dsn)
    assert code == 1
    assert "refused: not idempotent, would be called again: 1" in out
    assert "name it with --rerun charge" in err
    # the dry run of a refused redrive fails as the redrive does (a script can test it)
    code, out, err = invoke("redrive", str(task_id), "--from", "hold", "--dry-run", dsn=dsn)
    assert code == 1, (out, err)
    assert "refused: not idempotent" in out and "dry run: nothing was changed" in out

    code, out, err = invoke(
        "redrive", str(task_id), "--from", "hold", "--rerun", "charge", "--reason", "retry",
        dsn=dsn,
    )  # fmt: skip
    assert code == 0, err
    assert f"task {task_id} redriven; it is queued" in out
    assert invoke(*run, dsn=dsn)[0] == 0
    code, out, _ = invoke("show", str(task_id), dsn=dsn)
    assert "waiting" in out, out

    code, out, err = invoke("redrive", str(task_id), dsn=dsn)
    assert code == 1 and "only a failed or cancelled task can be redriven" in err


def test_bulk_redrive_previews_the_sums_then_applies_its_plan(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "charge.yaml"
    path.write_text(CHARGE)
    run = ["run", "--app", "tests.apps.counting", "--definitions", str(path), "--until-idle"]
    assert invoke("deploy", str(path), dsn=dsn)[0] == 0
    for _ in range(3):
        assert invoke("submit", "charge", dsn=dsn)[0] == 0
    assert invoke(*run, dsn=dsn)[0] == 0
    code, out, err = invoke("bulk", "signal", "go", "--definition", "charge", "--payload",
                            json.dumps({"fail": True}), "--yes", dsn=dsn)  # fmt: skip
    assert code == 0, err
    assert invoke(*run, dsn=dsn)[0] == 0

    code, out, err = invoke("bulk", "redrive", "--definition", "charge", "--from", "hold",
                            dsn=dsn)  # fmt: skip
    assert code == 0, err
    assert "redriven: 0 tasks" in out and "refused, left as they are: 3 tasks" in out, out
    assert "3 tasks: step 'charge' (count.work, charge#1) is not idempotent" in out, out
    refused_plan = out.split("plan ")[-1].split(" kept")[0]
    code, out, err = invoke("bulk", "apply", refused_plan, dsn=dsn)
    assert code == 0, err
    assert "0 acted on, 3 refused" in out, out
    assert "refused: step 'charge' (count.work, charge#1) is not idempotent" in out, out

    code, out, err = invoke("bulk", "redrive", "--definition", "charge", "--state", "failed",
                            "--reason", "fixed", dsn=dsn)  # fmt: skip
    assert code == 0, err
    assert "redriven: 3 tasks" in out and "effects called again: 0" in out, out
    assert "effects not called again (recorded results kept): 3" in out, out
    plan_id = int(out.split("plan ")[-1].split(" kept")[0])
    code, out, err = invoke("bulk", "apply", str(plan_id), dsn=dsn)
    assert code == 0, err
    assert f"plan {plan_id} applied: 3 acted on" in out, out
    code, out, err = invoke("tasks", "--definition", "charge", "--state", "queued", "--count",
                            dsn=dsn)  # fmt: skip
    assert out.strip().startswith("3"), out
