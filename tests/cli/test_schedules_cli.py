"""`toolkit deploy` of a definition that declares schedules, and the schedule commands that
refuse to edit them; a deploy that would break a schedule is refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import invoke

REPORT = """
name: report
version: {version}
input:
  type: object
  required: [day]
  properties: {{day: {{type: string}}{extra}}}
start: done
steps:
  done: {{succeed: {{}}}}
schedules:
  - name: report.nightly
    cron: "30 2 * * *"
    timezone: Europe/Amsterdam
    input: {{day: "${{ context.scheduled_at }}"}}
"""


def _write(tmp_path: Path, version: int, extra: str = "") -> Path:
    path = tmp_path / f"report-v{version}.yaml"
    text = REPORT.format(version=version, extra=extra)
    if extra:
        text = text.replace("required: [day]", "required: [day, region]")
    path.write_text(text)
    return path


def test_deploy_makes_the_declared_schedules_and_edits_are_refused(
    dsn: str, tmp_path: Path
) -> None:
    code, out, err = invoke("deploy", str(_write(tmp_path, 1)), dsn=dsn)
    assert code == 0, err
    assert 'schedule report.nightly: cron "30 2 * * *" in Europe/Amsterdam' in out, out
    code, out, _ = invoke("schedules", "list", "--json", dsn=dsn)
    (listed,) = json.loads(out)
    assert (listed["owner"], listed["owner_version"]) == ("definition", 1), listed
    code, _, err = invoke("schedules", "update", "report.nightly", "--every", "1h", dsn=dsn)
    assert code != 0 and "declared by report v1: change it in that YAML" in err, err
    code, _, err = invoke("schedules", "delete", "report.nightly", dsn=dsn)
    assert code != 0 and "remove it from that YAML" in err, err
    assert invoke("schedules", "pause", "report.nightly", dsn=dsn)[0] == 0
    # The input shows as JSON (as --input takes it); a pause without a reason, as "paused".
    code, out, err = invoke("schedules", "show", "report.nightly", dsn=dsn)
    assert code == 0, err
    assert 'input: {"day": "${ context.scheduled_at }"}' in " ".join(out.split()), out
    assert "paused: paused" not in out and "paused (paused)" not in out, out
    code, out, _ = invoke("schedules", "list", dsn=dsn)
    assert out.splitlines()[1].endswith("  paused"), out
    # columns as wide as their cells: an owner "definition" or a long cadence pushed the
    # next columns out of line
    lines = out.splitlines()
    column = lines[0].index("NEXT TICK")
    assert all(line[column : column + 4].isdigit() for line in lines[1:]), out


def test_a_deploy_that_would_break_a_schedule_is_refused_naming_it(
    dsn: str, tmp_path: Path
) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(REPORT.format(version=1, extra="").split("schedules:")[0])
    assert invoke("deploy", str(plain), dsn=dsn)[0] == 0
    code, _, err = invoke(
        "schedules", "create", "ops", "--definition", "report", "--every", "1h",
        "--input", '{"day": "x"}', dsn=dsn,
    )  # fmt: skip
    assert code == 0, err
    stricter = _write(tmp_path, 2, extra=", region: {type: string}")
    stricter.write_text(stricter.read_text().split("schedules:")[0])
    code, out, err = invoke("deploy", str(stricter), dsn=dsn)
    assert code != 0, out
    assert "report v2 is not deployed" in err and "schedule 'ops'" in err, err
    assert 'missing required field "region"' in err, err
    assert len(err.strip().splitlines()) <= 3, err  # a message, not a traceback
