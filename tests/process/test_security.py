"""The DSN's password is never shown: not in errors, not in logs, not in the output of any
command, worker processes included (the other security checks:
``tests/project/test_security.py``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.helpers.processes import REPO
from tests.helpers.workflows import THREE_STEPS
from toolkit.errors import DatabaseUnavailable
from toolkit.store.database import Database, redact_dsn

PASSWORD = "S3cr3t-Pa55word"
UNREACHABLE = [
    f"postgresql://alice:{PASSWORD}@127.0.0.1:1/app?connect_timeout=2",
    f"host=127.0.0.1 port=1 user=alice password={PASSWORD} dbname=app connect_timeout=2",
    f"postgresql://alice@127.0.0.1:1/app?password={PASSWORD}&connect_timeout=2",
]


@pytest.mark.parametrize("dsn", UNREACHABLE, ids=["uri", "keywords", "query"])
def test_the_password_never_appears_in_errors_or_logs(
    dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert PASSWORD not in redact_dsn(dsn)
    caplog.set_level(logging.DEBUG)

    async def connect() -> None:
        await Database.connect(dsn, timeout=2)

    with pytest.raises(DatabaseUnavailable) as info:
        anyio.run(connect)
    assert PASSWORD not in str(info.value) and "127.0.0.1" in str(info.value)
    assert PASSWORD not in caplog.text
    definitions = tmp_path / "three.yaml"
    definitions.write_text(THREE_STEPS)
    commands = [
        ["doctor"],
        ["doctor", "--json"],
        ["submit", "three-steps", "--input", "{}"],
        ["tasks"],
        ["deploy", str(definitions)],
        ["db", "status"],
        ["run", "--app", "tests.apps.counting", "--definitions", str(definitions)],
    ]
    env = {**os.environ, "TOOLKIT_DSN": dsn, "PYTHONPATH": str(REPO)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "toolkit", "--log-level", "DEBUG", *command],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]
    for command, process in zip(commands, processes, strict=True):
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 1, (command, output)
        assert PASSWORD not in output, (command, output)
        assert "Traceback" not in output, (command, output)
        assert "127.0.0.1" in output, (command, output)
