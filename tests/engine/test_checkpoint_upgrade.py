"""Tasks in flight survive the move of branch state out of the checkpoint (format 1 → 2).

A format-1 checkpoint kept a parallel or map step's branches inline
(``checkpoint.fanout.branches``). Such a task, stored by an older version mid-step, is
resumed by this one: its finished branches are not run again, its running ones go on, and
its next write stores the branches as rows and the checkpoint as format 2.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.helpers.inprocess import calls, deploy_submit, drain, sql
from toolkit.store import Store

pytestmark = pytest.mark.anyio

MAP = """
name: old-map
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      max_concurrency: 2
      branch:
        start: call
        steps:
          call: {effect: count.work, idempotent: true, args: {value: "${ context.item }"}}
    next: done
  done: {succeed: {output: "${ steps.each }"}}
"""


def _branch(name: str, status: str, output: Any = None) -> dict[str, Any]:
    """A branch frame as format 1 stored it."""
    ended = status != "running"
    return {
        "cursor": None if ended else "call", "outputs": {"call": output} if ended else {},
        "visits": {"call": 1}, "attempts": {}, "pending": None, "prefix": f"each#1/{name}/",
        "status": status, "output": output, "error": None, "spent": {},
    }  # fmt: skip


async def test_a_map_stored_inline_by_format_1_resumes_and_moves_to_rows(store: Store) -> None:
    (task_id,) = await deploy_submit(store, MAP, [{"items": ["a", "b", "c", "d"]}])
    done = {"step": "call", "value": "a", "attempt": 1}
    old = {
        "format": 1, "cursor": "each", "outputs": {}, "visits": {"each": 1}, "attempts": {},
        "pending": None, "steps_run": 0, "wait": None, "resolution": None,
        "fanout": {
            "occurrence": "each#1", "winner": None, "reserved": None, "spent": {},
            "branches": {"0": _branch("0", "succeeded", done), "1": _branch("1", "running")},
        },
    }  # fmt: skip
    await sql(store, "UPDATE toolkit_tasks SET checkpoint = %s WHERE id = %s", Jsonb(old), task_id)
    await drain(store, MAP)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task.error, task.checkpoint)
    assert task.result[0] == done  # the recorded output, not a new call
    assert [out["value"] for out in task.result] == ["a", "b", "c", "d"]
    assert task.checkpoint["format"] == 2
    counted = await calls(store)
    assert f"{task_id}:each#1/0/call#1" not in counted  # item 0 had ended: never called again
    assert all(counted[f"{task_id}:each#1/{i}/call#1"] == 1 for i in (1, 2, 3)), counted


async def test_a_format_1_step_paused_mid_way_writes_its_branches_as_rows(store: Store) -> None:
    (task_id,) = await deploy_submit(store, MAP, [{"items": ["a", "b"]}])
    old = {
        "format": 1, "cursor": "each", "outputs": {}, "visits": {"each": 1}, "attempts": {},
        "pending": None, "steps_run": 0, "wait": None, "resolution": None,
        "fanout": {"occurrence": "each#1", "winner": None, "reserved": None, "spent": {},
                   "branches": {"0": _branch("0", "failed")}},
    }  # fmt: skip
    old["fanout"]["branches"]["0"]["error"] = {"name": "Broken", "message": "it broke"}
    await sql(store, "UPDATE toolkit_tasks SET checkpoint = %s WHERE id = %s", Jsonb(old), task_id)
    await drain(store, MAP)
    task = await store.tasks.get(task_id)
    # the failed item fails the step, as it would have under format 1; item 1 never starts
    assert task.state == "failed" and task.error["name"] == "Broken", task.error
    assert task.error["branch"] == "0"
    assert f"{task_id}:each#1/1/call#1" not in await calls(store)
