"""Set steps: values from templates and the task's context, kept across a resume."""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import deploy_submit, drain, make_due
from toolkit.store import Store

pytestmark = pytest.mark.anyio

CONTEXT = """
name: context
version: 1
start: name
steps:
  name:
    set:
      label: "order ${ input.id } for ${ context.tenant }"
      total: "${ sum(input.amounts) }"
    next: call
  call:
    effect: count.flaky
    idempotent: true
    args: {fail_times: 1}
    retry: {max_attempts: 3, initial: 0.01s}
    next: echo
  echo:
    effect: count.work
    idempotent: true
    args: {value: {attempt: "${ context.attempt }", started: "${ context.started_at }"}}
    next: pause
  pause: {wait: {duration: 1h}, next: again}
  again: {effect: count.work, idempotent: true, args: {value: "${ context.started_at }"}}
"""


async def test_context_set_steps_and_templates(store: Store) -> None:
    (task_id,) = await deploy_submit(store, CONTEXT, [{"id": 7, "amounts": [1, 2, 3]}])
    await drain(store, CONTEXT)
    task = await store.tasks.get(task_id)
    outputs = task.checkpoint["outputs"]
    assert outputs["name"] == {"label": "order 7 for default", "total": 6}
    assert outputs["echo"]["value"]["attempt"] == 1
    started = outputs["echo"]["value"]["started"]
    assert started is not None
    await make_due(store, task_id)
    await drain(store, CONTEXT)
    task = await store.tasks.get(task_id)
    assert task.result["value"] == started  # the same value after a resume
