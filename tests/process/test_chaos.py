"""The short chaos run (``bench/chaos.py --short``) must lose nothing and repeat nothing.

It runs as a subprocess against a temporary embedded server of its own (which it restarts
once), or, when ``TOOLKIT_TEST_DSN`` is set, against that server (without a restart). The
seed comes from ``TOOLKIT_CHAOS_SEED`` (default 1), so CI can vary it and a failure can be
replayed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers.processes import REPO

pytestmark = pytest.mark.timeout(180)

FIGURES = re.compile(
    r"^chaos: seed (?P<seed>\d+), (?P<submitted>\d+) submitted, (?P<terminal>\d+) terminal "
    r"\((?P<failed>\d+) failed\), (?P<reconciliation>\d+) in reconciliation, (?P<lost>\d+) lost, "
    r"non-idempotent effects run more than once: (?P<repeated>\d+), "
    r"stale-token commits: (?P<stale>\d+), other audit violations: (?P<violations>\d+), "
    r"idempotent re-executions: (?P<reexecuted>\d+), "
    r"faults: kill=(?P<kill>\d+) stop=(?P<stop>\d+) terminate=(?P<terminate>\d+) "
    r"restart=(?P<restart>\d+), wall (?P<wall>[\d.]+) s$"
)


def test_short_chaos_run_loses_nothing_and_repeats_no_non_idempotent_effect() -> None:
    seed = os.environ.get("TOOLKIT_CHAOS_SEED", "1")
    command = [sys.executable, "bench/chaos.py", "--short", "--seed", seed]
    dsn = os.environ.get("TOOLKIT_TEST_DSN")
    if dsn:
        command += ["--dsn", dsn]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=150)
    lines = run.stdout.strip().splitlines()
    assert lines, f"no figure line\n{run.stderr}"
    match = FIGURES.match(lines[-1])
    assert match, f"not a figure line: {lines[-1]!r}\n{run.stderr}"
    figures = {name: float(value) for name, value in match.groupdict().items()}
    report = f"{lines[-1]}\n{run.stderr}"
    # The must-be-zero figures, and the exit status that says so.
    assert figures["lost"] == 0, report
    assert figures["repeated"] == 0, report
    assert figures["stale"] == 0, report
    assert figures["violations"] == 0, report
    assert run.returncode == 0, report
    # The run really ran, under every kind of fault.
    assert figures["submitted"] == 60, report
    assert figures["terminal"] + figures["reconciliation"] == 60, report
    assert min(figures["kill"], figures["stop"], figures["terminate"]) >= 1, report
    assert figures["restart"] == (0 if dsn else 1), report
