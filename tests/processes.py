"""Helpers to run real ``toolkit`` worker processes and wait on store conditions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent


def toolkit_process(dsn: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    """Start ``python -m toolkit ARGS`` against ``dsn`` with the tests' apps importable."""
    env = {
        **os.environ,
        "TOOLKIT_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[arg-type]
    )


def wait_for(
    condition: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition"
) -> None:
    """Poll a store condition until it holds, failing the test past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def query(dsn: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def call_counts(dsn: str) -> dict[str, int]:
    if not query(dsn, "SELECT to_regclass('test_calls')")[0][0]:
        return {}
    return {str(k): int(v) for k, v in query(dsn, "SELECT idempotency_key, calls FROM test_calls")}  # type: ignore[call-overload]
