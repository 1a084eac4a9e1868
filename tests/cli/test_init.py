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
from toolkit.definition import schema_path


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
    toolkit(project, dsn, "validate", "--app", "workflows", "definitions/")
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


def test_the_definition_points_editors_at_a_schema_the_project_has(tmp_path: Path) -> None:
    """Regression: the docs' `$schema=../schemas/workflow.schema.json` named a file only the
    repository has."""
    result = CliRunner().invoke(cli, ["init", str(tmp_path)])
    assert result.exit_code == 0, result.output
    definition = tmp_path / "definitions" / "hello.yaml"
    first = definition.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), first
    schema = (definition.parent / first.split("$schema=", 1)[1]).resolve()
    assert schema == (tmp_path / "schemas" / "workflow.schema.json").resolve()
    assert schema.read_text() == schema_path().read_text()
    assert "schemas/workflow.schema.json" in result.output


def test_validate_with_app_finds_a_handler_the_project_lacks(tmp_path: Path) -> None:
    CliRunner().invoke(cli, ["init", str(tmp_path)])
    definition = tmp_path / "definitions" / "hello.yaml"
    definition.write_text(
        definition.read_text().replace("effect: hello.greet", "effect: hello.great")
    )
    done = subprocess.run(
        [sys.executable, "-m", "toolkit", "validate", "--app", "workflows", "definitions/"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "error: definitions/hello.yaml:15: $.steps.greet.effect: no handler 'hello.great' is "
        "registered in app 'hello'; did you mean 'hello.greet'?\n"
    )
