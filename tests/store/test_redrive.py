"""Redrive (issue 19): a failed or cancelled task comes back from the step that failed, and
the effects that would run again are known (and refused when they may not) before acting.

The ledger of handler calls is ``test_calls`` (outside the task rows): calls per
idempotency key are the ground truth for "called again" and "not called again".
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps.counting import app, record_call
from tests.helpers.inprocess import deploy_submit, drain, make_due, sql
from tests.helpers.workflows import definition
from toolkit.application import EffectContext
from toolkit.errors import NotRedrivable, RedriveRefused
from toolkit.history.audit import audit_task
from toolkit.store import Store
from toolkit.store.redrive_plan import EffectFate

pytestmark = pytest.mark.anyio

#: Whether the "bug" of ``count.until_fixed`` is fixed (a test fixes it between runs).
FIXED: dict[str, bool] = {"on": False}


class Broken(Exception):
    """The handler's bug, until it is fixed."""


@app.effect("count.until_fixed")
async def until_fixed(ctx: EffectContext, value: Any = None) -> dict[str, Any]:
    await record_call(ctx)
    if not FIXED["on"] and value != "fine":
        raise Broken(f"{ctx.step} is broken")
    return {"step": ctx.step, "value": value}


@pytest.fixture(autouse=True)
def broken() -> None:
    FIXED["on"] = False


THREE = """
name: three
version: 1
start: one
steps:
  one: {effect: count.work, idempotent: true, args: {value: 1}, next: two}
  two: {effect: count.work, idempotent: false, args: {value: 2}, next: three}
  three:
    effect: count.until_fixed
    idempotent: true
    retry: {max_attempts: 1}
"""


async def calls(store: Store, task_id: int) -> dict[str, int]:
    """Handler calls by occurrence (the idempotency key without the task id)."""
    rows = await sql(
        store, "SELECT idempotency_key, calls FROM test_calls WHERE idempotency_key LIKE %s",
        f"{task_id}:%",
    )  # fmt: skip
    return {key.split(":", 1)[1]: n for key, n in rows}


async def failed_three(store: Store) -> int:
    (task_id,) = await deploy_submit(store, THREE, [{}])
    await drain(store, THREE)
    task = await store.tasks.get(task_id)
    assert task.state == "failed", task
    return task_id


async def test_redrive_calls_only_the_failed_step_again(store: Store) -> None:
    task_id = await failed_three(store)
    before = await store.tasks.get(task_id)
    FIXED["on"] = True
    plan = await store.tasks.redrive(task_id, reason="three fixed", operator="ops")
    fates = {effect.step: effect.fate for effect in plan.effects}
    assert fates == {"one": EffectFate.KEPT, "two": EffectFate.KEPT, "three": EffectFate.AGAIN}
    assert plan.resume == "three" and not plan.refused
    await drain(store, THREE)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task
    assert await calls(store, task_id) == {"one#1": 1, "two#1": 1, "three#1": 2}
    assert task.result == {"step": "three", "value": None}
    events = [e for e in await store.tasks.events(task_id) if e["kind"] == "redriven"]
    assert len(events) == 1 and events[0]["worker_id"] == "ops"
    assert events[0]["detail"]["reason"] == "three fixed"
    assert events[0]["fencing_token"] == before.lease_token + 1
    assert await audit_task(store, task_id) == []


async def test_from_a_non_idempotent_step_is_refused_unless_named(store: Store) -> None:
    task_id = await failed_three(store)
    FIXED["on"] = True
    with pytest.raises(RedriveRefused, match=r"step 'two' \(count.work, two#1\) is not idempotent"):
        await store.tasks.redrive(task_id, from_step="two")
    assert (await store.tasks.get(task_id)).state == "failed"  # nothing changed
    with pytest.raises(NotRedrivable, match="--rerun one"):
        await store.tasks.redrive(task_id, from_step="two", rerun=["one"])
    plan = await store.tasks.redrive(task_id, from_step="two", rerun=["two"])
    assert plan.occurrence == "two#2"
    assert {e.step: e.fate for e in plan.effects}["two"] is EffectFate.RERUN
    await drain(store, THREE)
    assert (await store.tasks.get(task_id)).state == "succeeded"
    # two ran again once, with a new idempotency key; one was not called again
    assert await calls(store, task_id) == {"one#1": 1, "two#1": 1, "two#2": 1, "three#1": 1,
                                           "three#2": 1}  # fmt: skip
    assert await audit_task(store, task_id) == []


async def test_a_dry_run_writes_nothing_and_previews(store: Store) -> None:
    task_id = await failed_three(store)
    before = await store.tasks.get(task_id)
    plan = await store.tasks.redrive(task_id, from_step="one", dry_run=True)
    assert plan.refused
    text = "\n".join(plan.lines())
    assert "called again: 1" in text and "one#1 (count.work)" in text
    assert "refused: step 'two'" in text
    after = await store.tasks.get(task_id)
    assert (after.state, after.lease_token, after.checkpoint) == (
        before.state, before.lease_token, before.checkpoint,
    )  # fmt: skip


@pytest.mark.parametrize("state", ["queued", "succeeded"])
async def test_a_task_in_another_state_is_refused(store: Store, state: str) -> None:
    text = THREE.replace("count.until_fixed", "count.work")
    (task_id,) = await deploy_submit(store, text, [{}])
    if state == "succeeded":
        await drain(store, text)
    with pytest.raises(NotRedrivable, match=f"task {task_id} .*only a failed or cancelled"):
        await store.tasks.redrive(task_id)


MAP = """
name: items
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      max_concurrency: 4
      branch:
        start: work
        steps:
          work:
            effect: count.until_fixed
            idempotent: true
            args: {value: "${ context.item }"}
            retry: {max_attempts: 1}
"""


async def test_a_map_runs_again_only_its_failed_items(store: Store) -> None:
    items = ["fine", "fine", "bad", "fine", "bad", "fine", "fine", "bad", "fine", "fine"]
    (task_id,) = await deploy_submit(store, MAP, [{"items": items}])
    await drain(store, MAP)
    task = await store.tasks.get(task_id)
    assert task.state == "failed", task
    FIXED["on"] = True
    plan = await store.tasks.redrive(task_id)
    first = await calls(store, task_id)
    await drain(store, MAP)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task, await store.tasks.events(task_id))
    again = await calls(store, task_id)
    ran = {occ for occ in again if again[occ] != first.get(occ, 0)}
    # the failed items ran again, and the items a decided map never began ran once
    never_begun = {occ for occ in again if occ not in first}
    assert {occ.split("/")[1] for occ in ran - never_begun} == set(plan.branches_again)
    assert {"each#1/2/work#1", "each#1/4/work#1", "each#1/7/work#1"} <= ran
    assert all(again[occ] == 1 for occ in never_begun)
    assert all(first[occ] == again[occ] for occ in first if first[occ] and occ not in ran)
    assert task.result == [{"step": "work", "value": item} for item in items]


NESTED = """
name: nested-items
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      branch:
        start: inner
        steps:
          inner:
            map:
              items: "${ context.item }"
              branch:
                start: work
                steps:
                  work:
                    effect: count.until_fixed
                    idempotent: true
                    args: {value: "${ context.item }"}
                    retry: {max_attempts: 1}
"""


async def test_a_failure_inside_a_nested_map_is_redriven_from_the_top_level_step(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, NESTED, [{"items": [["fine"], ["fine", "bad"]]}])
    await drain(store, NESTED)
    task = await store.tasks.get(task_id)
    assert task.state == "failed", task
    with pytest.raises(NotRedrivable, match=r"branch '1' of step 'each' stopped in its nested"
                                            r" step 'inner'.*--from each"):  # fmt: skip
        await store.tasks.redrive(task_id)
    FIXED["on"] = True
    await store.tasks.redrive(task_id, from_step="each")
    await drain(store, NESTED)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task, await store.tasks.events(task_id))
    assert task.result == [[{"step": "work", "value": "fine"}],
                           [{"step": "work", "value": "fine"},
                            {"step": "work", "value": "bad"}]]  # fmt: skip
    rows = await sql(store, "SELECT fanout FROM toolkit_branches WHERE task_id = %s", task_id)
    assert rows == [], rows  # the first run's nested rows went with its step


PARENT = """
name: parent
version: 1
start: call
steps:
  call: {workflow: {name: child}, next: done}
  done: {succeed: {output: "${ steps.call }"}}
"""
CHILD = """
name: child
version: 1
start: work
steps:
  work: {effect: count.until_fixed, idempotent: true, retry: {max_attempts: 1}}
"""


async def test_redriving_a_parent_redrives_its_failed_child(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD))
    (parent_id,) = await deploy_submit(store, PARENT, [{}])
    await drain(store, PARENT, CHILD)
    assert (await store.tasks.get(parent_id)).state == "failed"
    FIXED["on"] = True
    # --from the child step would start a new child, and leave the failed one
    preview = await store.tasks.redrive(parent_id, from_step="call", dry_run=True)
    (replaced,) = preview.children
    assert not replaced.redriven and "starts a new child" in "\n".join(preview.lines())
    plan = await store.tasks.redrive(parent_id)
    (child,) = plan.children
    assert child.redriven and child.plan is not None and child.plan.resume == "work"
    assert "child task" in "\n".join(plan.lines())
    await drain(store, PARENT, CHILD)
    parent = await store.tasks.get(parent_id)
    assert parent.state == "succeeded", (parent, await store.tasks.events(parent_id))
    assert (await store.tasks.get(child.child_id)).state == "succeeded"
    assert replaced.child_id == child.child_id
    assert await audit_task(store, child.child_id) == []


async def test_a_cancelled_waiting_task_waits_again(store: Store) -> None:
    text = """
name: approve
version: 1
start: ask
steps:
  ask: {wait: {signal: approved}, next: done}
  done: {succeed: {output: "${ steps.ask }"}}
"""
    (task_id,) = await deploy_submit(store, text, [{}])
    await drain(store, text)
    await store.tasks.cancel(task_id, "by mistake")
    plan = await store.tasks.redrive(task_id)
    assert plan.resume == "ask"
    await drain(store, text)
    assert (await store.tasks.get(task_id)).state == "waiting"
    await store.tasks.signal(task_id, "approved", {"ok": True})
    await drain(store, text)
    assert (await store.tasks.get(task_id)).state == "succeeded"


SAGA = """
name: saga
version: 1
start: reserve
steps:
  reserve:
    effect: count.work
    idempotent: true
    args: {value: stock}
    compensate: {effect: count.work, args: {value: unreserve}}
    next: charge
  charge:
    effect: count.work
    idempotent: false
    args: {value: card}
    compensate: {effect: count.work, args: {value: refund}}
    next: ship
  ship: {effect: count.until_fixed, idempotent: true, retry: {max_attempts: 1}}
"""


async def test_a_compensated_saga_is_redriven_only_from_before_its_compensations(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, SAGA, [{}])
    await drain(store, SAGA)
    assert (await store.tasks.get(task_id)).state == "failed"
    FIXED["on"] = True
    with pytest.raises(RedriveRefused, match=r"compensations ran .* --from a step at or before"):
        await store.tasks.redrive(task_id)
    with pytest.raises(RedriveRefused, match="compensations ran"):
        await store.tasks.redrive(task_id, from_step="charge", rerun=["charge"])
    await store.tasks.redrive(task_id, from_step="reserve", rerun=["charge"])
    await drain(store, SAGA)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task
    done = await calls(store, task_id)
    # the compensations that ran are not undone, and do not run again
    assert done["compensate/charge#1/charge#1"] == 1 and done["reserve#2"] == 1
    assert done["charge#2"] == 1 and done["ship#2"] == 1


async def test_onto_another_version_when_it_maps(store: Store) -> None:
    task_id = await failed_three(store)
    fixed = THREE.replace("version: 1", "version: 2").replace("count.until_fixed", "count.work")
    await store.definitions.deploy(definition(fixed))
    unmapped = THREE.replace("version: 1", "version: 3").replace("  two:", "  deux:").replace(
        "next: two", "next: deux"
    )
    await store.definitions.deploy(definition(unmapped))
    with pytest.raises(NotRedrivable, match=r"no step 'two' .*completed it"):
        await store.tasks.redrive(task_id, version=3)
    plan = await store.tasks.redrive(task_id, version=2)
    assert plan.to_version == 2
    task = await store.tasks.get(task_id)
    assert (task.definition_version, task.definition_digest) == (2, definition(fixed).digest)
    await drain(store, fixed)
    assert (await store.tasks.get(task_id)).state == "succeeded"


async def test_a_task_failed_at_its_deadline_needs_a_new_one(store: Store) -> None:
    text = """
name: slow
version: 1
timeout: 1h
start: wait
steps:
  wait: {wait: {duration: 2h}, next: done}
  done: {succeed: {output: 1}}
"""
    (task_id,) = await deploy_submit(store, text, [{}])
    await drain(store, text)
    await sql(store, "UPDATE toolkit_tasks SET deadline_at = statement_timestamp() WHERE id = %s",
              task_id)  # fmt: skip
    await make_due(store, task_id)
    await drain(store, text)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "Timeout", task
    with pytest.raises(NotRedrivable, match="--timeout DURATION"):
        await store.tasks.redrive(task_id)
    await store.tasks.redrive(task_id, timeout=7200)
    (row,) = await sql(
        store, "SELECT deadline_at > clock_timestamp() + interval '1 hour' FROM toolkit_tasks"
        " WHERE id = %s", task_id,
    )  # fmt: skip
    assert row[0]
    other = await failed_three(store)
    with pytest.raises(NotRedrivable, match="--timeout is for a task failed by its"):
        await store.tasks.redrive(other, timeout=60)

