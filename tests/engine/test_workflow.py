"""Child workflows (workflow steps), in-process against PostgreSQL: the child's output becomes
the step's, the parent waits without a lease, one child per step occurrence, cancellation
both ways, unknown definitions, the latest version, and a parent's deadline."""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import deploy_submit, drain, kinds, sql
from tests.helpers.workflows import definition
from toolkit.store import Store

pytestmark = pytest.mark.anyio

CHILD = """
name: child
version: 1
input: {type: object, required: [n], properties: {n: {type: integer}, fail: {default: false}}}
start: route
steps:
  route:
    choice: [{when: "${ input.fail }", next: broken}]
    default: work
  work: {effect: count.work, idempotent: true, args: {value: "${ input.n }"}}
  broken: {fail: {error: ChildBroke, message: "child ${ input.n } broke"}}
"""

PARENT = """
name: parent
version: 1
start: call
steps:
  call:
    workflow: {name: child, input: {n: "${ input.n }", fail: "${ input.fail }"}}
    next: done
    catch: [{errors: [ChildBroke], next: rescued}]
  done: {succeed: {output: "${ steps.call.value }"}}
  rescued: {succeed: {output: "${ steps.call.error }"}}
"""


async def test_a_child_workflow_runs_and_its_output_becomes_the_steps(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD))
    inputs = [{"n": 3, "fail": False}, {"n": 4, "fail": True}]
    (ok, bad) = await deploy_submit(store, PARENT, inputs)
    await drain(store, PARENT, CHILD)
    parent = await store.tasks.get(ok)
    assert (parent.state, parent.result) == ("succeeded", 3)
    rescued = await store.tasks.get(bad)
    assert rescued.state == "succeeded"
    assert rescued.result["name"] == "ChildBroke"
    assert rescued.result["message"] == "child 4 broke"
    children = await sql(
        store, "SELECT parent_id, parent_occurrence, state FROM toolkit_tasks "
        "WHERE parent_id IS NOT NULL ORDER BY parent_id",
    )  # fmt: skip
    assert children == [(ok, "call#1", "succeeded"), (bad, "call#1", "failed")]
    assert "child_started" in await kinds(store, ok)


async def test_a_parent_waits_for_its_child_without_a_lease(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD))
    (parent_id,) = await deploy_submit(store, PARENT, [{"n": 1, "fail": False}])
    await drain(store, PARENT)  # this worker does not run the child's definition
    parent = await store.tasks.get(parent_id)
    assert (parent.state, parent.wait_reason, parent.lease_owner) == ("waiting", "child", None)
    await drain(store, CHILD)  # the child ends and wakes its parent
    parent = await store.tasks.get(parent_id)
    assert parent.state == "waiting"
    due = await sql(
        store, "SELECT run_at <= clock_timestamp() FROM toolkit_tasks WHERE id = %s", parent_id
    )
    assert due == [(True,)]
    await drain(store, PARENT)
    assert (await store.tasks.get(parent_id)).result == 1


async def test_a_child_is_started_once_per_step_occurrence(store: Store) -> None:
    """A parent that loses its write after starting its child finds the same child again."""
    await store.definitions.deploy(definition(CHILD))
    (parent_id,) = await deploy_submit(store, PARENT, [{"n": 1, "fail": False}])
    await drain(store, PARENT)
    # Row surgery: the parent is back where it was before its wait was written.
    await sql(
        store,
        "UPDATE toolkit_tasks SET state = 'queued', wait_reason = NULL, run_at = now()"
        " WHERE id = %s",
        parent_id,
    )
    await drain(store, PARENT)
    rows = await sql(store, "SELECT count(*) FROM toolkit_tasks WHERE parent_id = %s", parent_id)
    assert rows == [(1,)]


async def test_cancelling_a_parent_cancels_its_live_children(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD))
    (parent_id,) = await deploy_submit(store, PARENT, [{"n": 1, "fail": False}])
    await drain(store, PARENT)
    assert await store.tasks.cancel(parent_id) == "cancelled"
    rows = await sql(store, "SELECT state FROM toolkit_tasks WHERE parent_id = %s", parent_id)
    assert rows == [("cancelled",)]


async def test_a_cancelled_child_fails_its_parents_step(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD))
    (parent_id,) = await deploy_submit(store, PARENT, [{"n": 1, "fail": False}])
    await drain(store, PARENT)
    (child_id,) = [
        row[0] for row in await sql(store, "SELECT id FROM toolkit_tasks WHERE parent_id = %s",
                                    parent_id)
    ]  # fmt: skip
    await store.tasks.cancel(child_id)
    await drain(store, PARENT)
    parent = await store.tasks.get(parent_id)
    assert parent.state == "failed" and parent.error["name"] == "ChildCancelled"


UNKNOWN_CHILD = """
name: orphan
version: 1
start: call
steps:
  call: {workflow: {name: nowhere}}
"""


async def test_a_child_of_an_unknown_definition_fails_the_step(store: Store) -> None:
    (task_id,) = await deploy_submit(store, UNKNOWN_CHILD, [{}])
    await drain(store, UNKNOWN_CHILD)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "UnknownDefinition"


# --- a child pinned to the latest version -----------------------------------------------------

CHILD_V1 = """
name: versioned-child
version: 1
start: s
steps:
  s: {succeed: {output: 1}}
"""
CHILD_V2 = CHILD_V1.replace("version: 1", "version: 2").replace("output: 1", "output: 2")
LATEST_PARENT = """
name: latest-parent
version: 1
start: call
steps:
  call: {workflow: {name: versioned-child}}
"""


async def test_a_child_without_a_version_is_pinned_to_the_latest(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD_V1))
    await store.definitions.deploy(definition(CHILD_V2))
    (task_id,) = await deploy_submit(store, LATEST_PARENT, [{}])
    await drain(store, LATEST_PARENT, CHILD_V1, CHILD_V2)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", 2)


SLOW_PARENT = """
name: slow-parent
version: 1
timeout: 1h
start: call
steps:
  call: {workflow: {name: versioned-child, version: 1}}
"""


async def test_a_parent_past_its_deadline_cancels_its_live_child(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD_V1))
    (task_id,) = await deploy_submit(store, SLOW_PARENT, [{}])
    await drain(store, SLOW_PARENT)  # the child's definition is served by no worker here
    assert (await store.tasks.get(task_id)).wait_reason == "child"
    await sql(
        store, "UPDATE toolkit_tasks SET deadline_at = statement_timestamp(), run_at = "
        "statement_timestamp() WHERE id = %s", task_id,
    )  # fmt: skip
    await drain(store, SLOW_PARENT)
    parent = await store.tasks.get(task_id)
    assert parent.state == "failed" and parent.error["name"] == "Timeout"
    rows = await sql(store, "SELECT state FROM toolkit_tasks WHERE parent_id = %s", task_id)
    assert rows == [("cancelled",)]
