"""Process-level tests: real `toolkit run` workers, killed and stopped with signals."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.processes import (
    call_counts,
    query,
    submit_tasks,
    task_diagnosis,
    toolkit_process,
    wait_for,
)
from tests.helpers.workflows import FIVE_SLOW_STEPS

RUN = ["run", "--app", "tests.apps.counting", "--lease", "2", "--heartbeat", "0.5"]


def _completed_steps(dsn: str, task_id: int) -> set[str]:
    rows = query(
        dsn,
        "SELECT step FROM toolkit_effect_evidence WHERE task_id = %s AND record = 'completed'",
        (task_id,),
    )
    return {str(r[0]) for r in rows}


@pytest.fixture
def definitions_file(tmp_path: Path) -> Path:
    path = tmp_path / "five-slow.yaml"
    path.write_text(FIVE_SLOW_STEPS)
    return path


def test_sigkill_mid_workflow_then_another_worker_finishes_it(
    dsn: str, definitions_file: Path
) -> None:
    (task_id,) = submit_tasks(dsn, FIVE_SLOW_STEPS, [{"seconds": 0.4}])
    first = toolkit_process(dsn, *RUN, "--definitions", str(definitions_file), "--worker-id", "A")
    try:
        wait_for(lambda: "s2" in _completed_steps(dsn, task_id), what="s2 completed")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
    before = call_counts(dsn)
    second = toolkit_process(
        dsn, *RUN, "--definitions", str(definitions_file), "--worker-id", "B", "--until-idle"
    )
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    state, token = query(
        dsn, "SELECT state, lease_token FROM toolkit_tasks WHERE id = %s", (task_id,)
    )[0]
    assert state == "succeeded" and token == 2
    after = call_counts(dsn)
    keys = {step: f"{task_id}:{step}#1" for step in ("s1", "s2", "s3", "s4", "s5")}
    # Completed effects were replayed from evidence, never called again.
    assert after[keys["s1"]] == 1 and after[keys["s2"]] == 1
    assert before[keys["s1"]] == 1 and before[keys["s2"]] == 1
    # The idempotent step in flight at the kill may run again (same key); the rest once.
    assert after[keys["s3"]] in (1, 2)
    assert after[keys["s4"]] == 1 and after[keys["s5"]] == 1
    kinds = [
        r[0]
        for r in query(
            dsn, "SELECT kind FROM toolkit_task_events WHERE task_id = %s ORDER BY id", (task_id,)
        )
    ]
    assert "recovered" in kinds and kinds[-1] == "succeeded"
    assert "claimed 1" in out


def test_sigterm_during_work_exits_zero_and_loses_nothing(dsn: str, definitions_file: Path) -> None:
    ids = submit_tasks(dsn, FIVE_SLOW_STEPS, [{"seconds": 0.3}] * 3)
    # A grace the call in flight ends within, however late the signal comes: the cycle then
    # releases its task before the next step that is not idempotent (on a Citus cluster the
    # signal came as s1 ended, and the 0.2 s grace this test had cut s2 off).
    worker = toolkit_process(dsn, *RUN, "--definitions", str(definitions_file), "--grace", "2")
    wait_for(lambda: bool(call_counts(dsn)), what="a handler running")
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "Traceback" not in err
    rows = query(dsn, "SELECT state, lease_owner FROM toolkit_tasks WHERE id = ANY(%s)", (ids,))
    assert all(state in ("queued", "succeeded") and owner is None for state, owner in rows)
    finisher = toolkit_process(dsn, *RUN, "--definitions", str(definitions_file), "--until-idle")
    _, err = finisher.communicate(timeout=60)
    assert finisher.returncode == 0, err
    states = query(dsn, "SELECT state FROM toolkit_tasks WHERE id = ANY(%s)", (ids,))
    assert [s for (s,) in states] == ["succeeded"] * 3, (err, [task_diagnosis(dsn, i) for i in ids])
    # A released task resumes from its checkpoint: at most the in-flight idempotent step repeats.
    assert all(n <= 2 for n in call_counts(dsn).values())
    assert sum(1 for n in call_counts(dsn).values() if n == 2) <= 3
