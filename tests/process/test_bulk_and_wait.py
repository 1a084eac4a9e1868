"""Process-level tests of bulk plans and awaited results: `toolkit bulk apply` killed with
SIGKILL half-way and run again, and `toolkit submit --wait` / `Tasks.result` answered while a
real `toolkit run` worker, another process, ends the tasks."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.helpers.processes import eventually, query, submit_tasks, toolkit_process, wait_for
from toolkit.errors import TaskFailed
from toolkit.store import Store

HOLD = """
name: bulk-hold
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {signal: go}, next: done}
  done: {succeed: {output: {signal: "${ steps.hold }"}}}
"""

QUICK = """
name: quick
version: 1
input: {type: object}
start: work
steps:
  work:
    effect: count.flaky
    idempotent: true
    retry: {max_attempts: 1}
    args: {fail_times: "${ input.fail_times }", error: Declined}
    next: done
  done: {succeed: {output: "${ steps.work }"}}
"""

TASKS = 3_000
BATCH = 50


def _applied(dsn: str, plan_id: int) -> int:
    rows = query(
        dsn,
        "SELECT count(*) FROM toolkit_bulk_plan_tasks WHERE plan_id = %s AND outcome IS NOT NULL",
        (plan_id,),
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def test_an_apply_killed_half_way_then_run_again_signals_each_task_once(dsn: str) -> None:
    ids = submit_tasks(dsn, HOLD, [{}] * TASKS)
    plan = toolkit_process(dsn, "bulk", "signal", "go", "--definition", "bulk-hold")
    out, err = plan.communicate(timeout=60)
    assert plan.returncode == 0, err
    plan_id = int(out.split("plan ")[-1].split(" kept")[0])
    applying = toolkit_process(dsn, "bulk", "apply", str(plan_id), "--batch-size", str(BATCH))
    try:
        wait_for(lambda: _applied(dsn, plan_id) >= 10 * BATCH, what="ten batches applied")
    finally:
        applying.send_signal(signal.SIGKILL)
        applying.communicate(timeout=10)
    done_at_kill = _applied(dsn, plan_id)
    assert done_at_kill < TASKS, "the apply finished before the kill: the test proved nothing"
    assert done_at_kill % BATCH == 0, "a batch is one transaction: all of it or none"
    again = toolkit_process(dsn, "bulk", "apply", str(plan_id), "--batch-size", str(BATCH))
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert out.startswith(f"plan {plan_id} applied: {TASKS:,} acted on"), out
    counts = dict(query(
        dsn,
        "SELECT task_id, count(*) FROM toolkit_signals WHERE task_id = ANY(%s) GROUP BY task_id",
        (ids,),
    ))  # fmt: skip
    twice = {task: n for task, n in counts.items() if n != 1}
    assert len(counts) == TASKS and not twice, f"signalled twice: {twice}"
    events = query(
        dsn,
        "SELECT count(*) FROM toolkit_task_events WHERE kind = 'signal_received'"
        " AND (detail ->> 'plan')::bigint = %s",
        (plan_id,),
    )
    assert events == [(TASKS,)]


@pytest.fixture
def worker(dsn: str, tmp_path: Path) -> subprocess.Popen[str]:
    folder = tmp_path / "definitions"
    folder.mkdir()
    (folder / "hold.yaml").write_text(HOLD)
    (folder / "quick.yaml").write_text(QUICK)
    submit_tasks(dsn, HOLD, [])
    submit_tasks(dsn, QUICK, [])
    process = toolkit_process(
        dsn, "run", "--app", "tests.apps.counting", "--definitions", str(folder),
        "--worker-id", "waited-on",
    )  # fmt: skip
    yield process
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)


def _submit_wait(dsn: str, *args: str) -> subprocess.Popen[str]:
    return toolkit_process(dsn, "submit", *args, "--wait")


def test_submit_wait_answers_for_each_ending(dsn: str, worker: subprocess.Popen[str]) -> None:
    ok = _submit_wait(dsn, "quick", "--input", '{"fail_times": 0}')
    failed = _submit_wait(dsn, "quick", "--input", '{"fail_times": 1}')
    cancelled = _submit_wait(dsn, "bulk-hold")
    timed_out = _submit_wait(dsn, "bulk-hold", "--wait-timeout", "1s")
    out, err = ok.communicate(timeout=60)
    assert (ok.returncode, json.loads(out)) == (0, {"attempt": 1}), err
    out, err = failed.communicate(timeout=60)
    assert failed.returncode == 3 and json.loads(out)["name"] == "Declined", err
    out, err = timed_out.communicate(timeout=60)
    assert timed_out.returncode == 5 and "it goes on" in err, err
    assert cancelled.stderr is not None
    line = cancelled.stderr.readline()  # "task N submitted; waiting for it to end"
    task_id = int(line.split()[1])
    wait_for(
        lambda: query(dsn, "SELECT state, awaited FROM toolkit_tasks WHERE id = %s",
                      (task_id,)) == [("waiting", True)],
        what=f"task {task_id} waiting and awaited",
    )  # fmt: skip
    code, _, err = _cli(dsn, "cancel", str(task_id))
    assert code == 0, err
    out, err = cancelled.communicate(timeout=60)
    assert cancelled.returncode == 4 and json.loads(out)["name"] == "Cancelled", err


def test_ctrl_c_stops_the_wait_and_says_the_task_goes_on(dsn: str) -> None:
    """Regression: Ctrl-C on ``toolkit wait`` printed "Aborted!" and exited 1, the status of
    a refused command, without saying that the task was not stopped."""
    (task_id,) = submit_tasks(dsn, HOLD, [{}])
    waiting = toolkit_process(dsn, "wait", str(task_id))
    wait_for(
        lambda: query(dsn, "SELECT awaited FROM toolkit_tasks WHERE id = %s", (task_id,))
        == [(True,)],
        what=f"toolkit wait to await task {task_id}",
    )  # fmt: skip
    waiting.send_signal(signal.SIGINT)
    out, err = waiting.communicate(timeout=30)
    assert (waiting.returncode, out) == (130, ""), err
    assert err == f"stopped waiting (Ctrl-C); task {task_id} goes on (`toolkit show`)\n", err
    assert query(dsn, "SELECT state FROM toolkit_tasks WHERE id = %s", (task_id,)) == [
        ("queued",)
    ]


def _cli(dsn: str, *args: str) -> tuple[int, str, str]:
    process = toolkit_process(dsn, *args)
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def test_result_in_python_while_a_worker_process_ends_the_task(
    dsn: str, worker: subprocess.Popen[str]
) -> None:
    async def main() -> None:
        async with await Store.open(dsn, migrate_schema=False) as store:
            ok = await store.definitions.submittable("bulk-hold")
            (task_id,) = await store.tasks.submit(ok, [{}])
            quick = await store.definitions.submittable("quick")
            (failing,) = await store.tasks.submit(quick, [{"fail_times": 1}])
            with pytest.raises(TaskFailed) as caught:
                await store.tasks.result(failing, timeout=60, poll=3600)
            assert caught.value.name == "Declined"
            async with anyio.create_task_group() as group:
                outcome = {}

                async def wait() -> None:
                    outcome["value"] = await store.tasks.result(task_id, timeout=60, poll=3600)

                group.start_soon(wait)
                async def waiting() -> bool:
                    return (await store.tasks.get(task_id)).state == "waiting"

                await eventually(waiting, what=f"task {task_id} waiting")
                await store.tasks.signal(task_id, "go", {"n": 1})
            assert outcome == {"value": {"signal": {"n": 1}}}

    anyio.run(main)
