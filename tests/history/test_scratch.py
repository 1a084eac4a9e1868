"""A scratch database is removed however its session ends: by ``stop``, at exit, or by its
watchdog when the session's process is killed (issue 24, item 4: kernels leaked servers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.helpers.processes import REPO, wait_for

SESSION = """
import sys
from toolkit.history.scratch import ScratchDatabase
scratch = ScratchDatabase()
print(scratch.start(), flush=True)
print(scratch._cleanup.get("home", scratch._cleanup.get("name")), flush=True)
sys.stdin.readline()  # the test has seen the database
if sys.argv[1] == "exit":
    sys.exit(0)  # no stop(): atexit must clean up
sys.stdin.read()  # wait to be killed
"""


def start_session(how: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    process = subprocess.Popen(
        [sys.executable, "-c", SESSION, how],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    dsn = process.stdout.readline().strip()
    where = process.stdout.readline().strip()
    assert dsn and where, "the session printed no DSN"
    return process, dsn, where


def gone(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return False
    except psycopg.OperationalError:
        return True


def wait_gone(dsn: str, where: str) -> None:
    wait_for(
        lambda: gone(dsn) and not (where.startswith("/") and Path(where).exists()),
        what=f"{where} to be removed ({dsn})",
    )


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_scratch_database_is_removed_when_its_session_ends(how: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOOLKIT_TEST_DSN"}
    process, dsn, home = start_session(how, env)
    try:
        assert not gone(dsn)
        if how == "kill":
            process.send_signal(signal.SIGKILL)
        else:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        process.wait(timeout=30)
        wait_gone(dsn, home)
    finally:
        process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
