"""Process-level tests of schedules: real `toolkit run` workers fire an every-second schedule
together, one of them SIGKILLed and one SIGSTOPped past its lease, and every tick in the window
starts exactly one task."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.processes import query, submit_tasks, toolkit_process, wait_for

QUICK = """
name: ticked
version: 1
input: {type: object, required: [tick]}
start: done
steps:
  done: {succeed: {output: "${ input.tick }"}}
"""

RUN = ["run", "--app", "tests.apps.counting", "--lease", "2", "--heartbeat", "0.5"]


def _ticks(dsn: str) -> list[object]:
    rows = query(
        dsn, "SELECT scheduled_at FROM toolkit_tasks WHERE schedule_name = 'pulse'"
        " ORDER BY scheduled_at"
    )  # fmt: skip
    return [row[0] for row in rows]


@pytest.fixture
def definitions(tmp_path: Path) -> Path:
    path = tmp_path / "ticked.yaml"
    path.write_text(QUICK)
    return path


def test_three_workers_fire_each_tick_once_while_one_dies_and_one_stalls(
    dsn: str, definitions: Path
) -> None:
    submit_tasks(dsn, QUICK, [])  # deploys the definition
    made = toolkit_process(
        dsn, "schedules", "create", "pulse", "--definition", "ticked", "--every", "1s",
        "--input", '{"tick": "${ context.scheduled_at }"}', "--overlap", "allow_all",
    )  # fmt: skip
    _, err = made.communicate(timeout=60)
    assert made.returncode == 0, err
    workers = [
        toolkit_process(
            dsn, *RUN, "--definitions", str(definitions), "--worker-id", f"w{i}",
            stdout=subprocess.DEVNULL,
        )
        for i in range(3)
    ]
    try:
        wait_for(lambda: len(_ticks(dsn)) >= 5, timeout=60, what="five ticks fired")
        workers[0].send_signal(signal.SIGKILL)
        workers[1].send_signal(signal.SIGSTOP)
        start = len(_ticks(dsn))
        wait_for(lambda: len(_ticks(dsn)) >= start + 5, timeout=60, what="five more ticks")
        workers[1].send_signal(signal.SIGCONT)
        resumed = len(_ticks(dsn))
        wait_for(lambda: len(_ticks(dsn)) >= resumed + 5, timeout=60, what="five after SIGCONT")
        pause = toolkit_process(dsn, "schedules", "pause", "pulse")
        _, err = pause.communicate(timeout=60)
        assert pause.returncode == 0, err
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGCONT)
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.communicate(timeout=60)
    ticks = _ticks(dsn)
    seconds = [t.timestamp() for t in ticks]  # type: ignore[attr-defined]
    assert len(set(seconds)) == len(seconds), "a tick started two tasks"
    expected = int(seconds[-1] - seconds[0]) + 1
    missing = sorted(set(range(int(seconds[0]), int(seconds[-1]) + 1)) - {int(s) for s in seconds})
    assert len(seconds) == expected, (
        f"{len(seconds)} ticks fired between the first and the last, {expected} in that "
        f"window: missing {missing}"
    )
    keys = query(
        dsn, "SELECT count(DISTINCT idempotency_key) FROM toolkit_tasks"
        " WHERE schedule_name = 'pulse'"
    )  # fmt: skip
    assert keys == [(len(ticks),)]


FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.mark.skipif(not FAKETIME.exists(), reason="no libfaketime (apt install faketime)")
@pytest.mark.parametrize("offset", ["+1h", "-1h"])
def test_a_worker_whose_clock_is_an_hour_off_fires_on_time(
    dsn: str, definitions: Path, offset: str
) -> None:
    """Ticks are database time: the worker's own clock plays no part in when they fire."""
    submit_tasks(dsn, QUICK, [])
    made = toolkit_process(
        dsn, "schedules", "create", "pulse", "--definition", "ticked", "--every", "1s",
        "--input", '{"tick": "${ context.scheduled_at }"}', "--overlap", "allow_all",
    )  # fmt: skip
    assert made.communicate(timeout=60)[0].startswith("schedule pulse")
    env = {"LD_PRELOAD": str(FAKETIME), "FAKETIME": offset, "FAKETIME_DONT_RESET": "1"}
    worker = toolkit_process(
        dsn, *RUN, "--definitions", str(definitions), "--worker-id", "skewed",
        stdout=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        wait_for(lambda: len(_ticks(dsn)) >= 5, timeout=60, what="five ticks fired")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    lags = query(
        dsn, "SELECT extract(epoch FROM created_at - scheduled_at) FROM toolkit_tasks"
        " WHERE schedule_name = 'pulse'"
    )  # fmt: skip
    assert all(0 <= float(lag) < 30 for (lag,) in lags), lags  # type: ignore[arg-type]
