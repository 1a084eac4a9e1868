"""``toolkit watch`` over a real worker (docs/progress.md): what a step publishes while it runs
is printed in order, and the exit status is the task's outcome."""

from __future__ import annotations

import json
import select
from pathlib import Path

from tests.helpers.processes import submit_tasks, toolkit_process

STREAMING = """
name: streaming
version: 1
input: {type: object}
start: generate
steps:
  generate:
    effect: count.stream
    idempotent: true
    args: {count: 5, seconds: 0.1}
"""


def test_watch_prints_the_published_items_in_order_and_exits_with_the_outcome(
    dsn: str, tmp_path: Path
) -> None:
    (tmp_path / "streaming.yaml").write_text(STREAMING)
    (task_id,) = submit_tasks(dsn, STREAMING, [{}])
    watch = toolkit_process(dsn, "watch", str(task_id))
    processes = [watch]
    try:
        # The worker starts once the watch follows the task (its first line is the task's
        # state): a worker that started first could finish before the watch looked
        # (regression: seen under load, the first state printed was "succeeded").
        assert watch.stdout is not None
        ready, _, _ = select.select([watch.stdout], [], [], 60)
        assert ready, "toolkit watch printed nothing in 60 s"
        first = watch.stdout.readline()
        processes.append(toolkit_process(
            dsn, "run", "--app", "tests.apps.counting", "--definitions", str(tmp_path),
            "--until-idle",
        ))  # fmt: skip
        rest, err = watch.communicate(timeout=60)
        processes[1].communicate(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    out = first + rest
    assert watch.returncode == 0, (out, err)
    lines = out.splitlines()
    items = [line for line in lines if line.startswith("item ")]
    assert items == [f'item {n + 1} {{"token": {n}}}' for n in range(5)], out
    states = [line for line in lines if line.startswith("state ")]
    assert states[0] in ("state queued", "state leased") and states[-1] == "state succeeded", out
    assert lines.index(items[-1]) < lines.index("state succeeded"), out
    result = json.loads("\n".join(lines[lines.index("state succeeded") + 1 :]))
    assert result == {"tokens": 5}, out
