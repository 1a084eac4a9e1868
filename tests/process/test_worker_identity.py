"""Worker-id uniqueness survives a stall (issue 15, item 6), with real worker processes.

A worker SIGSTOPped past its registration loses its worker id to a second process started
with the same ``--worker-id``; continued, the first finds out at its next heartbeat and
stops (exit 1, one line saying why) instead of running under the id beside the second; a
third is refused while the second lives.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.helpers.processes import query, toolkit_process, wait_for
from tests.helpers.workflows import THREE_STEPS

LEASE, HEARTBEAT = 2.0, 0.5


def _run(dsn: str, definitions: Path, *extra: str) -> subprocess.Popen[str]:
    return toolkit_process(
        dsn, "run", "--app", "tests.apps.counting", "--definitions", str(definitions),
        "--worker-id", "same", "--lease", str(LEASE), "--heartbeat", str(HEARTBEAT), *extra,
    )  # fmt: skip


def _registration(dsn: str) -> tuple[object, ...] | None:
    rows = query(
        dsn,
        "SELECT pid, incarnation, stopped_at IS NULL AND expires_at > clock_timestamp()"
        " FROM toolkit_workers WHERE worker_id = 'same'",
    )
    return rows[0] if rows else None


def test_a_worker_that_stalled_past_its_registration_stops_when_its_id_was_taken(
    dsn: str, tmp_path: Path
) -> None:
    definitions = tmp_path / "three.yaml"
    definitions.write_text(THREE_STEPS)
    first = _run(dsn, definitions)
    second = third = None
    try:
        wait_for(lambda: (_registration(dsn) or (None,))[0] == first.pid, what="registered")
        first.send_signal(signal.SIGSTOP)
        wait_for(lambda: _registration(dsn)[2] is False, timeout=LEASE * 5, what="expired")
        second = _run(dsn, definitions)
        wait_for(lambda: (_registration(dsn) or (None,))[0] == second.pid, what="taken over")
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=30)
        assert first.returncode == 1, (first.returncode, out, err)
        assert "was taken over by another process" in err, err
        assert "Traceback" not in err, err
        # The second runs on under the id; the first's stop did not mark it stopped.
        assert second.poll() is None
        pid, _, live = _registration(dsn)  # type: ignore[misc]
        assert (pid, live) == (second.pid, True)
        third = _run(dsn, definitions)
        _, err = third.communicate(timeout=30)
        assert third.returncode == 1 and "is held by another live process" in err, err
    finally:
        for process in (first, second, third):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
                try:
                    process.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate()
