"""Crashes in the middle of parallel and map steps and races: real worker processes, SIGKILL.

Each test kills a ``toolkit run`` process while branches are in flight, lets another worker
take the task over, and checks per-branch handler call counts in ``test_calls`` (the ground
truth outside the task rows): a finished branch never runs again, a non-idempotent effect
never runs twice, and a race's recorded winner survives the crash.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.processes import (
    backdate_leases,
    call_counts,
    query,
    submit_tasks,
    task_events,
    task_row,
    toolkit_process,
    wait_for,
)
from toolkit.history.audit import audit_task

RUN = ["run", "--app", "tests.apps.scenarios", "--lease", "2", "--heartbeat", "0.5"]


def _worker(
    dsn: str, text: str, tmp_path: Path, worker_id: str, *extra: str
) -> subprocess.Popen[str]:
    path = tmp_path / "definition.yaml"
    path.write_text(text)
    return toolkit_process(dsn, *RUN, "--definitions", str(path), "--worker-id", worker_id, *extra)


def _kill(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.communicate(timeout=10)


def _finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, f"exit {process.returncode}\n{out}\n{err}"
    assert "Traceback" not in err, err
    return out


def _audit_clean(dsn: str, task_id: int) -> None:
    import anyio

    from toolkit.store import Store

    async def main() -> None:
        async with await Store.open(dsn) as store:
            assert await audit_task(store, task_id) == []

    anyio.run(main)


PARALLEL = """
name: crash-parallel
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        a:
          start: quick
          steps:
            quick: {effect: scn.work, idempotent: false, next: slow}
            slow: {effect: scn.slow_first_call, idempotent: true, args: {seconds: 60},
                   retry: {max_attempts: 2}}
        b:
          start: quick
          steps:
            quick: {effect: scn.work, idempotent: false}
        c:
          start: quick
          steps:
            quick: {effect: scn.work, idempotent: false, next: slow}
            slow: {effect: scn.slow_first_call, idempotent: true, args: {seconds: 60},
                   retry: {max_attempts: 2}}
    next: done
  done: {succeed: {output: "${ steps.fan }"}}
"""


def test_a_crash_mid_parallel_resumes_each_branch_where_it_was(dsn: str, tmp_path: Path) -> None:
    (task_id,) = submit_tasks(dsn, PARALLEL, [{}])
    first = _worker(dsn, PARALLEL, tmp_path, "w1")
    try:
        slow = {f"{task_id}:fan#1/a/slow#1", f"{task_id}:fan#1/c/slow#1"}
        wait_for(lambda: slow <= call_counts(dsn).keys(), timeout=20, what="both slow steps")
        # Branch b's end and the quick steps' evidence are committed before the slow calls.
        wait_for(
            lambda: bool(query(
                dsn, "SELECT 1 FROM toolkit_branches WHERE task_id = %s AND name = 'b'"
                " AND status = 'succeeded'", (task_id,),
            )),
            timeout=10,
            what="branch b recorded",
        )  # fmt: skip
    finally:
        _kill(first)
    backdate_leases(dsn, [task_id])
    second = _worker(dsn, PARALLEL, tmp_path, "w2", "--until-idle")
    _finish(second)
    row = task_row(dsn, task_id)
    assert row["state"] == "succeeded", row["error"]
    assert sorted(row["result"]) == ["a", "b", "c"]
    counts = call_counts(dsn)
    for branch in "abc":  # the non-idempotent quick steps ran exactly once each
        assert counts[f"{task_id}:fan#1/{branch}/quick#1"] == 1, counts
    for branch in "ac":  # the idempotent slow steps in flight at the kill ran again
        assert counts[f"{task_id}:fan#1/{branch}/slow#1"] == 2, counts
    kinds = [e["kind"] for e in task_events(dsn, task_id)]
    assert kinds.count("branch_succeeded") == 3  # b's success was not repeated
    assert "recovered" in kinds
    _audit_clean(dsn, task_id)


MAP = """
name: crash-map
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      max_concurrency: 2
      branch:
        start: once
        steps:
          once: {effect: scn.work, idempotent: false, next: slow}
          slow:
            effect: scn.slow_first_call
            idempotent: true
            args: {seconds: "${ context.item }"}
"""


def test_a_crash_mid_map_keeps_finished_items_and_the_concurrency_bound(
    dsn: str, tmp_path: Path
) -> None:
    # Items 0 and 1 are quick; 2 and 3 hang on their first call until the worker dies.
    (task_id,) = submit_tasks(dsn, MAP, [{"items": [0, 0, 60, 60, 0]}])
    first = _worker(dsn, MAP, tmp_path, "w1")
    try:
        hanging = {f"{task_id}:each#1/2/slow#1", f"{task_id}:each#1/3/slow#1"}
        wait_for(lambda: hanging <= call_counts(dsn).keys(), timeout=20, what="items 2 and 3")
    finally:
        _kill(first)
    counts = call_counts(dsn)
    assert f"{task_id}:each#1/4/once#1" not in counts  # never more than 2 at once
    backdate_leases(dsn, [task_id])
    _finish(_worker(dsn, MAP, tmp_path, "w2", "--until-idle"))
    row = task_row(dsn, task_id)
    assert row["state"] == "succeeded", row["error"]
    assert len(row["result"]) == 5
    counts = call_counts(dsn)
    for item in range(5):
        assert counts[f"{task_id}:each#1/{item}/once#1"] == 1, counts
    for item in (0, 1, 4):
        assert counts[f"{task_id}:each#1/{item}/slow#1"] == 1, counts
    for item in (2, 3):
        assert counts[f"{task_id}:each#1/{item}/slow#1"] == 2, counts
    _audit_clean(dsn, task_id)


NESTED = """
name: crash-nested
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      branch:
        start: checks
        steps:
          checks:
            parallel:
              branches:
                a:
                  start: once
                  steps:
                    once: {effect: scn.work, idempotent: false, next: slow}
                    slow:
                      effect: scn.slow_first_call
                      idempotent: true
                      args: {seconds: "${ context.parent.item }"}
                b:
                  start: once
                  steps:
                    once: {effect: scn.work, idempotent: false}
"""


def test_a_crash_mid_nested_fanout_resumes_each_nested_branch_where_it_was(
    dsn: str, tmp_path: Path
) -> None:
    # Item 0 is quick; item 1's branch a hangs on its first slow call until the worker dies.
    (task_id,) = submit_tasks(dsn, NESTED, [{"items": [0, 60]}])
    first = _worker(dsn, NESTED, tmp_path, "w1")
    try:
        hanging = f"{task_id}:each#1/1/checks#1/a/slow#1"
        wait_for(lambda: hanging in call_counts(dsn), timeout=20, what="item 1's slow call")
        wait_for(
            lambda: bool(query(
                dsn, "SELECT 1 FROM toolkit_branches WHERE task_id = %s AND fanout = 'each#1'"
                " AND name = '0' AND status = 'succeeded'", (task_id,),
            )),
            timeout=10,
            what="item 0 recorded",
        )  # fmt: skip
    finally:
        _kill(first)
    backdate_leases(dsn, [task_id])
    _finish(_worker(dsn, NESTED, tmp_path, "w2", "--until-idle"))
    row = task_row(dsn, task_id)
    assert row["state"] == "succeeded", (row["error"], task_events(dsn, task_id))
    assert [sorted(item) for item in row["result"]] == [["a", "b"], ["a", "b"]]
    counts = call_counts(dsn)
    for item in (0, 1):  # the non-idempotent steps ran exactly once each
        for branch in "ab":
            assert counts[f"{task_id}:each#1/{item}/checks#1/{branch}/once#1"] == 1, counts
    assert counts[f"{task_id}:each#1/0/checks#1/a/slow#1"] == 1, counts
    assert counts[f"{task_id}:each#1/1/checks#1/a/slow#1"] == 2, counts  # in flight: again
    assert query(dsn, "SELECT 1 FROM toolkit_branches WHERE task_id = %s", (task_id,)) == []
    _audit_clean(dsn, task_id)


RACE = """
name: crash-race
version: 1
start: race
steps:
  race:
    parallel:
      mode: first_success
      branches:
        fast:
          start: win
          steps:
            win: {effect: scn.work, idempotent: false, args: {value: fast}}
        slow:
          start: lose
          steps:
            lose: {effect: scn.slow_first_call, idempotent: true, args: {seconds: 60}}
    next: after
  after: {effect: scn.work, idempotent: false, args: {value: "${ steps.race.value }"}}
"""


def test_a_race_winner_survives_a_crash(dsn: str, tmp_path: Path) -> None:
    (task_id,) = submit_tasks(dsn, RACE, [{}])
    first = _worker(dsn, RACE, tmp_path, "w1")
    try:
        wait_for(
            lambda: (task_row(dsn, task_id)["checkpoint"].get("fanout") or {}).get("winner")
            == "fast",
            timeout=20,
            what="the winner recorded",
        )
    finally:
        _kill(first)  # the loser is still running: the step has not ended
    backdate_leases(dsn, [task_id])
    _finish(_worker(dsn, RACE, tmp_path, "w2", "--until-idle"))
    row = task_row(dsn, task_id)
    assert row["state"] == "succeeded", row["error"]
    assert row["result"]["value"] == "fast"
    counts = call_counts(dsn)
    assert counts[f"{task_id}:race#1/fast/win#1"] == 1  # the race was never re-run
    assert counts[f"{task_id}:after#1"] == 1
    won = [e for e in task_events(dsn, task_id) if e["kind"] == "race_won"]
    assert len(won) == 1
    rows = query(dsn, "SELECT count(*) FROM toolkit_effect_evidence WHERE task_id = %s "
                      "AND occurrence = %s AND record = 'started'",
                 (task_id, "race#1/fast/win#1"))  # fmt: skip
    assert rows == [(1,)]


APPROVALS = """
name: crash-approvals
version: 1
start: ask
steps:
  ask:
    parallel:
      branches:
        legal: &approver
          start: request
          steps:
            request: {effect: scn.work, idempotent: false, next: answer}
            answer: {wait: {signal: approval}, next: decide}
            decide:
              choice:
                - when: "${ steps.answer.approved }"
                  next: approved
              default: rejected
            approved: {effect: scn.work, idempotent: false}
            rejected: {fail: {error: Rejected}}
        finance: *approver
        security: *approver
    next: done
  done: {succeed: {output: "${ steps.ask }"}}
"""


def _waiting_branches(dsn: str, task_id: int) -> list[str]:
    rows = query(
        dsn,
        "SELECT name FROM toolkit_branches WHERE task_id = %s AND status = 'waiting'"
        " ORDER BY name",
        (task_id,),
    )
    return [str(name) for (name,) in rows]


def test_parallel_approvals_arrive_one_by_one_across_worker_kills(
    dsn: str, tmp_path: Path
) -> None:
    """Three branches each wait for an approval; between approvals the worker is killed
    (SIGKILL) and another starts. No effect runs twice; the task holds no lease while its
    branches wait."""
    (task_id,) = submit_tasks(dsn, APPROVALS, [{}])
    order = ["security", "legal", "finance"]
    for round_number, approver in enumerate([None, *order]):
        worker = _worker(dsn, APPROVALS, tmp_path, f"w{round_number}")
        try:
            if approver is not None:
                code = toolkit_process(
                    dsn, "signal", str(task_id), "approval", "--branch", approver,
                    "--payload", '{"approved": true}',
                )  # fmt: skip
                _, err = code.communicate(timeout=30)
                assert code.returncode == 0, err
            if approver == order[-1]:
                wait_for(lambda: task_row(dsn, task_id)["state"] == "succeeded", timeout=30,
                         what="the task succeeded")  # fmt: skip
                break
            left = sorted(set(order[round_number:]))

            def parked(left: list[str] = left) -> bool:
                waiting = _waiting_branches(dsn, task_id) == left
                return waiting and task_row(dsn, task_id)["wait_reason"] == "branches"

            wait_for(parked, timeout=30, what=f"branches {left} waiting")
            row = task_row(dsn, task_id)
            assert (row["lease_owner"], row["lease_expires_at"]) == (None, None), row
        finally:
            _kill(worker)
    row = task_row(dsn, task_id)
    assert row["state"] == "succeeded", (row, task_events(dsn, task_id))
    counts = call_counts(dsn)
    for name in order:  # each branch's two non-idempotent calls ran exactly once
        assert counts[f"{task_id}:ask#1/{name}/request#1"] == 1, counts
        assert counts[f"{task_id}:ask#1/{name}/approved#1"] == 1, counts
    _audit_clean(dsn, task_id)


DISTRIBUTED = """
name: crash-distributed-map
version: 1
start: each
steps:
  each:
    map:
      distributed: true
      items_from: {effect: scn.pages, args: {total: 35, size: 10, hang_at: 20}}
      workflow: {name: crash-map-item}
      items_per_task: 3
"""

MAP_ITEM = """
name: crash-map-item
version: 1
start: once
steps:
  once: {effect: scn.work, idempotent: false, args: {value: "${ input.first_index }"}}
"""


def test_a_crash_mid_listing_resumes_at_the_last_page_and_starts_no_item_twice(
    dsn: str, tmp_path: Path
) -> None:
    # The third page hangs on its first call until the worker dies; the pages before it are
    # listed and their children started before. The first worker runs no child (a child in
    # flight at the kill would wait for reconciliation: not what this test is about).
    parent_only, both = tmp_path / "parent", tmp_path / "both"
    for folder in (parent_only, both):
        folder.mkdir()
        (folder / "map.yaml").write_text(DISTRIBUTED)
    (both / "item.yaml").write_text(MAP_ITEM)
    assert submit_tasks(dsn, MAP_ITEM, []) == []  # deployed: the map pins its version
    (task_id,) = submit_tasks(dsn, DISTRIBUTED, [{}])
    first = toolkit_process(dsn, *RUN, "--definitions", str(parent_only), "--worker-id", "w1")
    try:
        hanging = f"{task_id}:each#1/page/each#3"
        wait_for(lambda: hanging in call_counts(dsn), timeout=20, what="the third page's call")
    finally:
        _kill(first)
    listed = query(dsn, "SELECT count(*) FROM toolkit_tasks WHERE parent_id = %s", (task_id,))
    assert listed == [(8,)]  # two pages of 10 items, 4 tasks each (3 + 3 + 3 + 1)
    backdate_leases(dsn, [task_id])
    _finish(toolkit_process(dsn, *RUN, "--definitions", str(both), "--worker-id", "w2",
                            "--until-idle"))  # fmt: skip
    row = task_row(dsn, task_id)
    assert row["state"] == "succeeded", (row["error"], task_events(dsn, task_id))
    assert row["result"]["items"] == 35 and row["result"]["succeeded"] == 35, row["result"]
    children = query(
        dsn, "SELECT map_index, state FROM toolkit_tasks WHERE parent_id = %s ORDER BY map_index",
        (task_id,),
    )  # fmt: skip
    assert [index for index, _ in children] == [0, 3, 6, 9, 10, 13, 16, 19, 20, 23, 26, 29, 30,
                                               33]  # fmt: skip
    counts = call_counts(dsn)
    once = {key: n for key, n in counts.items() if key.endswith(":once#1")}
    assert len(once) == 14 and set(once.values()) == {1}, once  # each item task ran once
    assert counts[f"{task_id}:each#1/page/each#3"] == 2  # the hung call, then again
    assert counts[f"{task_id}:each#1/page/each#1"] == 1  # written before the crash: not again
    _audit_clean(dsn, task_id)
