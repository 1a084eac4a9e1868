"""Choice steps: a loop through a choice makes each iteration a new occurrence, and a
runaway loop stops at ``max_steps``, in a branch too. (A loop of pure steps that would hold
a worker's event loop: ``tests/process/test_pure_steps.py``.)"""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import deploy_submit, drain, kinds, sql
from toolkit.store import Store

pytestmark = pytest.mark.anyio

LOOP = """
name: loop
version: 1
max_steps: 12
start: work
steps:
  work: {effect: count.work, idempotent: true, args: {value: "${ context.attempt }"}, next: again}
  again:
    choice: [{when: "${ input.forever }", next: work}]
    default: done
  done: {succeed: {output: "${ steps.work }"}}
"""


async def test_each_loop_iteration_is_a_new_occurrence_and_a_runaway_loop_stops(
    store: Store,
) -> None:
    (runaway,) = await deploy_submit(store, LOOP, [{"forever": True}])
    await drain(store, LOOP)
    task = await store.tasks.get(runaway)
    assert task.state == "failed" and task.error["name"] == "MaxStepsExceeded"
    keys = [row[0] for row in await sql(store, "SELECT idempotency_key FROM test_calls")]
    assert len(keys) == len(set(keys)) == 6  # work#1 .. work#6, each its own key
    assert len(task.checkpoint["outputs"]) == 1  # only the latest output of each step


BRANCH_LOOP = """
name: branch-loop
version: 1
max_steps: 300
start: fan
steps:
  fan:
    parallel:
      branches:
        spin:
          start: ping
          steps:
            ping:
              choice:
                - {when: "${ input.stop }", next: done}
              default: pong
            pong:
              choice:
                - {when: "${ input.stop }", next: done}
              default: ping
            done: {succeed: {}}
        quick:
          start: hello
          steps:
            hello: {succeed: {output: hi}}
    catch:
      - {errors: [MaxStepsExceeded], next: after}
  after:
    succeed: {}
"""


async def test_a_loop_of_pure_steps_in_a_branch_ends_at_max_steps(store: Store) -> None:
    # The branch fails at the bound (branches count their steps in the task's); its step's
    # catch routes on, and the task's next step ends the task.
    (task_id,) = await deploy_submit(store, BRANCH_LOOP, [{"stop": False}])
    await drain(store, BRANCH_LOOP)
    record = await store.tasks.get(task_id)
    assert (record.state, (record.error or {}).get("name")) == ("failed", "MaxStepsExceeded"), (
        record, await kinds(store, task_id)
    )  # fmt: skip
    events = await store.tasks.events(task_id)
    failed = [e["detail"] for e in events if e["kind"] == "branch_failed"]
    assert ("spin", "MaxStepsExceeded") in [(d["branch"], d["error"]["name"]) for d in failed]
    assert record.error is not None and record.error["step"] == "after"
