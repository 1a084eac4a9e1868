"""``toolkit init`` makes a project that runs as it stands, and never overwrites a file
(issue 24, item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tests.helpers.processes import REPO
from toolkit.cli import cli


def toolkit(cwd: Path, dsn: str, *args: str) -> str:
    env = {**os.environ, "TOOLKIT_DSN": dsn, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "toolkit", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"toolkit {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_a_new_project_runs_its_workflow_to_the_end(dsn: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["init", str(tmp_path / "shop")])
    assert result.exit_code == 0, result.output
    project = tmp_path / "shop"
    assert (project / ".toolkit").is_dir(), "the project's own embedded home"
    assert "toolkit run --app workflows --until-idle" in (project / "README.md").read_text()
    toolkit(project, dsn, "validate", "definitions/")
    toolkit(project, dsn, "deploy", "definitions/")
    submitted = toolkit(project, dsn, "submit", "hello", "--input", '{"name": "Ada"}')
    task_id = submitted.strip()  # submit prints the id alone
    toolkit(project, dsn, "run", "--app", "workflows", "--until-idle")
    shown = json.loads(toolkit(project, dsn, "show", task_id, "--json"))
    assert shown["task"]["state"] == "succeeded", shown
    assert shown["task"]["result"] == {"greeting": "Hello, Ada!"}, shown


def test_init_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "workflows.py").write_text("# mine\n")
    result = CliRunner().invoke(cli, ["init", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path / 'workflows.py'} exists already; nothing was written" in result.output
    assert (tmp_path / "workflows.py").read_text() == "# mine\n"
    assert not (tmp_path / "definitions").exists()
