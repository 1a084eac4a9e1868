"""Choice steps: a loop through a choice makes each iteration a new occurrence, and a
runaway loop stops at ``max_steps``."""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import deploy_submit, drain, sql
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
