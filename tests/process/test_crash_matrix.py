"""The crash matrix: a worker process dies at each fault point of an effect (DESIGN §2, "Effect").

Workflow ``a (idempotent) -> b (the effect under test) -> c (idempotent) -> done``. A first
worker runs with ``TOOLKIT_FAULT_POINT`` armed on step ``b`` and exits with status 97 there;
its lease is backdated (row surgery: lease expiry is not what is tested here), and a normal
worker resumes the task. The number of calls of each handler is counted in ``test_calls``,
outside the task rows, keyed by idempotency key.

Where the store is at each point (engine.py ``_effect``): ``a``'s completed evidence is held
in memory until the next write; that write is the one before ``b``'s call (with ``b``'s
intent when ``b`` is not idempotent). ``b``'s completed evidence is committed with the write
before ``c``'s call.

Expected, per fault point:

- ``before_intent``: nothing about ``b`` is stored; ``b`` runs once on resume; succeeded. The
  point lies before the write that first makes ``a``'s outcome durable (``a``'s completion
  rides with ``b``'s first write: docs/decisions.md), so it is also ``a``'s "after the call,
  before the completion commit": the idempotent ``a`` is called again with the same key.
- ``after_intent``: idempotent -> nothing but an unwritten attempt: ``b`` runs once on resume;
  non-idempotent -> the intent has no outcome: fail closed, ``waiting``/``reconciliation``,
  ``b`` never called.
- ``during_call`` / ``after_call``: idempotent -> called again with the same key (2 calls);
  non-idempotent -> 1 call, then ``waiting``/``reconciliation``.
- ``after_commit``: ``b`` completed is stored: replayed, never called again (1 call).

In every other case ``a`` ran exactly once; ``c`` once in every case. A reconciliation case
is then resolved with ``toolkit reconcile --completed --result ...`` and must finish with
``b``'s output equal to the reconciled result, without calling ``b`` again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.processes import (
    backdate_leases,
    call_counts,
    submit_tasks,
    task_events,
    task_evidence,
    task_row,
    toolkit_process,
)
from toolkit.faults import FAULT_EXIT_CODE, POINTS

RUN = ["run", "--app", "tests.apps.scenarios", "--lease", "2", "--heartbeat", "0.5"]

WORKFLOW = """
name: crash-matrix
version: 1
input: {{type: object}}
start: a
steps:
  a: {{effect: scn.work, idempotent: true, args: {{value: "${{ input.n }}"}}, next: b}}
  b:
    {{effect: scn.work, idempotent: {idempotent}, args: {{value: "${{ steps.a.value }}"}}, next: c}}
  c: {{effect: scn.work, idempotent: true, args: {{value: "${{ steps.b.value }}"}}, next: done}}
  done: {{succeed: {{output: {{b: "${{ steps.b }}", c: "${{ steps.c }}"}}}}}}
"""

#: (calls of b, final state, wait reason) after the crash and one normal worker.
EXPECTED: dict[tuple[str, bool], tuple[int, str, str | None]] = {
    ("before_intent", True): (1, "succeeded", None),
    ("before_intent", False): (1, "succeeded", None),
    ("after_intent", True): (1, "succeeded", None),
    ("after_intent", False): (0, "waiting", "reconciliation"),
    ("during_call", True): (2, "succeeded", None),
    ("during_call", False): (1, "waiting", "reconciliation"),
    ("after_call", True): (2, "succeeded", None),
    ("after_call", False): (1, "waiting", "reconciliation"),
    ("after_commit", True): (1, "succeeded", None),
    ("after_commit", False): (1, "succeeded", None),
}

RECONCILED = {"reconciled": True, "value": "by operator"}


def _case(point: str, idempotent: bool) -> object:
    name = f"{point}-{'idem' if idempotent else 'nonidem'}"
    return pytest.param(point, idempotent, id=name)


CASES = [_case(point, idempotent) for point in POINTS for idempotent in (True, False)]


def _run_to_exit(dsn: str, definitions: Path, *extra: str) -> tuple[int, str, str]:
    process = toolkit_process(dsn, *RUN, "--definitions", str(definitions), "--until-idle", *extra)
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


@pytest.mark.parametrize(("point", "idempotent"), CASES)
def test_crash_at_fault_point(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, idempotent: bool
) -> None:
    text = WORKFLOW.format(idempotent=str(idempotent).lower())
    definitions = tmp_path / "crash-matrix.yaml"
    definitions.write_text(text)
    (task_id,) = submit_tasks(dsn, text, [{"n": 7}])
    keys = {step: f"{task_id}:{step}#1" for step in "abc"}

    # 1. A worker armed to die at `point` of step b.
    with monkeypatch.context() as armed:  # toolkit_process copies os.environ at start
        armed.setenv("TOOLKIT_FAULT_POINT", point)
        armed.setenv("TOOLKIT_FAULT_STEP", "b")
        code, out, err = _run_to_exit(dsn, definitions, "--worker-id", "faulty")
    assert code == FAULT_EXIT_CODE, f"worker exited {code}, not at the fault\n{out}\n{err}"
    crashed = task_row(dsn, task_id)
    assert crashed["state"] == "leased" and crashed["lease_owner"] == "faulty"
    assert crashed["lease_token"] == 1

    # 2. Skip the lease expiry (not under test here), then a normal worker resumes.
    assert backdate_leases(dsn, [task_id]) == 1
    code, out, err = _run_to_exit(dsn, definitions, "--worker-id", "healthy")
    assert code == 0, err
    assert "Traceback" not in err

    b_calls, state, wait_reason = EXPECTED[(point, idempotent)]
    task = task_row(dsn, task_id)
    counts = call_counts(dsn)
    assert counts.get(keys["b"], 0) == b_calls, counts
    assert (task["state"], task["wait_reason"]) == (state, wait_reason)
    assert task["lease_token"] == 2 and task["lease_owner"] is None
    kinds = [e["kind"] for e in task_events(dsn, task_id)]
    assert kinds.count("recovered") == 1
    # b's calls, if two, used one idempotency key: the table counts them under it.
    assert set(counts) <= set(keys.values()), counts
    b_evidence = [e for e in task_evidence(dsn, task_id) if e["step"] == "b"]
    assert {e["idempotency_key"] for e in b_evidence} <= {keys["b"]}

    if state == "waiting":
        # Fail closed: the intent is stored without an outcome, b is not called again.
        assert task["checkpoint"]["pending"] == "b#1"
        assert [e["record"] for e in b_evidence] == ["started"]
        assert kinds[-1] == "reconciliation_required"
        assert counts.get(keys["c"], 0) == 0
        reconcile = toolkit_process(
            dsn, "reconcile", str(task_id), "b", "--completed", "--result", json.dumps(RECONCILED)
        )
        out, err = reconcile.communicate(timeout=30)
        assert reconcile.returncode == 0, err
        assert "reconciled as completed" in out
        assert task_row(dsn, task_id)["state"] == "queued"
        code, out, err = _run_to_exit(dsn, definitions, "--worker-id", "after-reconcile")
        assert code == 0, err
        task = task_row(dsn, task_id)
        counts = call_counts(dsn)
        assert task["state"] == "succeeded", task
        assert task["checkpoint"]["outputs"]["b"] == RECONCILED
        assert task["result"]["b"] == RECONCILED
        assert task["result"]["c"]["value"] == "by operator"
        assert counts.get(keys["b"], 0) == b_calls, counts
        records = [e["record"] for e in task_evidence(dsn, task_id) if e["step"] == "b"]
        assert records == ["started", "completed"]
    else:
        assert task["result"]["b"]["value"] == 7
        assert task["result"]["b"]["key"] == keys["b"]
        assert [e["record"] for e in b_evidence] == (
            ["completed"] if idempotent else ["started", "completed"]
        )
    assert counts.get(keys["c"], 0) == 1, counts
    assert counts.get(keys["a"], 0) == (2 if point == "before_intent" else 1), counts


#: With ``--checkpoint-window``: (calls of a, calls of b) when b is idempotent. a's outcome
#: is not written before b's call, so every crash before the terminal write calls a again.
WINDOWED = {"after_intent": (2, 1), "during_call": (2, 2), "after_call": (2, 2)}


@pytest.mark.parametrize("point", list(WINDOWED))
def test_a_crash_inside_the_checkpoint_window_calls_the_unwritten_steps_again(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    text = WORKFLOW.format(idempotent="true")
    definitions = tmp_path / "crash-matrix.yaml"
    definitions.write_text(text)
    (task_id,) = submit_tasks(dsn, text, [{"n": 7}])
    keys = {step: f"{task_id}:{step}#1" for step in "abc"}
    window = ("--checkpoint-window", "60")
    with monkeypatch.context() as armed:
        armed.setenv("TOOLKIT_FAULT_POINT", point)
        armed.setenv("TOOLKIT_FAULT_STEP", "b")
        code, out, err = _run_to_exit(dsn, definitions, "--worker-id", "faulty", *window)
    assert code == FAULT_EXIT_CODE, f"worker exited {code}, not at the fault\n{out}\n{err}"
    assert task_evidence(dsn, task_id) == [], "a's outcome waited for a later write"
    assert backdate_leases(dsn, [task_id]) == 1
    code, out, err = _run_to_exit(dsn, definitions, "--worker-id", "healthy", *window)
    assert code == 0, err
    task = task_row(dsn, task_id)
    counts = call_counts(dsn)
    assert task["state"] == "succeeded", task
    a_calls, b_calls = WINDOWED[point]
    assert counts == {keys["a"]: a_calls, keys["b"]: b_calls, keys["c"]: 1}, counts
    assert task["result"]["b"]["key"] == keys["b"]
    records = [(e["step"], e["record"]) for e in task_evidence(dsn, task_id)]
    assert records == [("a", "completed"), ("b", "completed"), ("c", "completed")], records


POISON = """
name: poison
version: 1
input: {type: object}
start: a
steps:
  a: {effect: scn.work, idempotent: true, retry: {max_attempts: unlimited}, next: b}
  b: {effect: scn.work, idempotent: true, retry: {max_attempts: 2}, next: done}
  done: {succeed: {output: "${ steps.b }"}}
"""


def test_a_step_that_crashes_every_worker_fails_its_task_with_a_checkpoint_window(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (a helper's report): behind a window the cursor stays on a, so every
    takeover blamed a (unlimited attempts) and b crashed every worker for ever. Now the first
    takeover counts a lapse and writes every outcome, so later crashes name b."""
    definitions = tmp_path / "poison.yaml"
    definitions.write_text(POISON)
    (task_id,) = submit_tasks(dsn, POISON, [{}])
    monkeypatch.setenv("TOOLKIT_FAULT_POINT", "during_call")
    monkeypatch.setenv("TOOLKIT_FAULT_STEP", "b")
    exits = []
    for run in range(6):
        code, out, err = _run_to_exit(
            dsn, definitions, "--worker-id", f"w{run}", "--checkpoint-window", "60"
        )
        exits.append(code)
        if code == 0:
            break
        assert code == FAULT_EXIT_CODE, f"run {run} exited {code}\n{out}\n{err}"
        assert backdate_leases(dsn, [task_id]) == 1
    task = task_row(dsn, task_id)
    events = task_events(dsn, task_id)
    assert task["state"] == "failed", (task, events)
    assert task["error"]["name"] == "AttemptsExhausted" and task["error"]["step"] == "b", task
    lost = [e["detail"]["step"] for e in events if e["kind"] == "attempt_lost"]
    assert lost == ["b", "b"], events
    assert exits == [FAULT_EXIT_CODE] * 3 + [0], exits
