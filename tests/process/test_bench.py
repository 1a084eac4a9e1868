"""The throughput benchmark runs (``bench/throughput.py`` in small), so that it cannot rot
unseen: it drives the engine's own statements and writes. Nothing here asserts a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.processes import REPO


def test_the_throughput_benchmark_runs_end_to_end(server_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    command = [
        sys.executable, "bench/throughput.py", "--dsn", server_dsn, "--scenarios", "A,B",
        "--tasks", "50", "--repeat", "1", "--idle-submits", "0", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["tasks"] for row in rows] == [50, 10], rows
    # the floor's run beside the engine's, one per round, for the target's same-round ratio
    assert [len(row["floor_rounds_steps_per_s"]) for row in rows] == [1, 1], rows


def test_the_event_and_bulk_redrive_benchmarks_run(server_dsn: str) -> None:
    """``bench/events.py``, ``bench/bulk_redrive.py`` and ``bench/tracing.py`` in small:
    their tables come out."""
    for script, args in (
        ("bench/events.py", ["--waiting", "10,20", "--emits", "3", "--repeat", "1"]),
        ("bench/bulk_redrive.py", ["--sizes", "3", "--repeat", "1"]),
        ("bench/tracing.py", ["--tasks", "10", "--rounds", "1"]),
    ):
        command = [sys.executable, script, "--dsn", server_dsn, *args]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{script}:\n{done.stdout}{done.stderr}"
        assert done.stdout.splitlines()[0].startswith("| "), done.stdout
