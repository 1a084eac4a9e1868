"""A stale worker's publish is refused (issue 23, docs/progress.md), with real processes: a
worker SIGSTOPped past its lease while its step streams, continued after another worker
took the task over, publishes nothing more that readers can see."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.helpers.processes import query, submit_tasks, task_row, toolkit_process, wait_for

STREAMING = """
name: streaming
version: 1
input: {type: object}
start: generate
steps:
  generate:
    effect: count.stream
    idempotent: true
    args: {count: 4, seconds: 1.0}
"""


def items(dsn: str, task_id: int) -> list[tuple[int, int, dict[str, int]]]:
    """(seq, fencing token, value) of the task's stream, in order."""
    rows = query(
        dsn, "SELECT seq, fencing_token, value FROM toolkit_task_stream WHERE task_id = %s "
        "ORDER BY seq", (task_id,),
    )  # fmt: skip
    return [(int(seq), int(token), value) for seq, token, value in rows]  # type: ignore[call-overload]


def worker(dsn: str, definitions: Path, worker_id: str) -> subprocess.Popen[str]:
    """A worker of its own id (a stopped process keeps its id: another may not take it)."""
    return toolkit_process(
        dsn, "run", "--app", "tests.apps.counting", "--definitions", str(definitions),
        "--lease", "2", "--heartbeat", "0.5", "--worker-id", worker_id,
    )  # fmt: skip


def test_a_publish_after_the_lease_was_taken_over_is_not_visible(
    dsn: str, tmp_path: Path
) -> None:
    (tmp_path / "streaming.yaml").write_text(STREAMING)
    (task_id,) = submit_tasks(dsn, STREAMING, [{}])
    stale = worker(dsn, tmp_path, "stale")
    fresh: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: bool(items(dsn, task_id)), what="the first worker's first item")
        stale.send_signal(signal.SIGSTOP)
        fresh = worker(dsn, tmp_path, "fresh")
        wait_for(
            lambda: any(token == 2 for _, token, _ in items(dsn, task_id)),
            what=lambda: "the second worker's first item, under fencing token 2 (task "
            f"{task_row(dsn, task_id)}, stream {items(dsn, task_id)})",
        )
        before_continue = [item for item in items(dsn, task_id) if item[1] == 1]
        stale.send_signal(signal.SIGCONT)  # its step wakes and publishes again: refused
        wait_for(lambda: task_row(dsn, task_id)["state"] == "succeeded", timeout=60,
                 what=f"task {task_id} succeeded")  # fmt: skip
    finally:
        stale.send_signal(signal.SIGCONT)
        for process in (stale, fresh):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=30)
    stream = items(dsn, task_id)
    tokens = [token for _, token, _ in stream]
    assert [item for item in stream if item[1] == 1] == before_continue, stream
    assert tokens == sorted(tokens), f"two attempts' items interleaved: {stream}"
    assert [value for _, token, value in stream if token == 2] == [
        {"token": n} for n in range(4)
    ], stream
    assert [seq for seq, _, _ in stream] == list(range(1, len(stream) + 1)), stream
