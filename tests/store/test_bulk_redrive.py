"""Bulk redrive (issue 19): the failed and cancelled tasks a filter matches, redriven through
a plan whose preview sums the effects that would run again, applied only to tasks whose
state and fencing token are still those planned.

The ledger of handler calls is ``test_calls``, as in ``test_redrive.py``.
"""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import deploy_submit, drain, sql
from tests.store.test_redrive import FIXED, THREE, calls
from toolkit.errors import PlanRefused
from toolkit.history.audit import audit_task
from toolkit.store import Store
from toolkit.store.filters import TaskFilter

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def broken() -> None:
    FIXED["on"] = False


async def failed_threes(store: Store, n: int) -> list[int]:
    """``n`` tasks of THREE, failed at step three; one more that succeeded."""
    ids = await deploy_submit(store, THREE, [{}] * n)
    await drain(store, THREE)
    states = {task.id: task.state for task in await store.tasks.list(TaskFilter())}
    assert all(states[i] == "failed" for i in ids), states
    return ids


async def test_bulk_redrive_previews_the_sums_and_redrives_each_matched_task_once(
    store: Store,
) -> None:
    ids = await failed_threes(store, 4)
    plan = await store.bulk.plan_redrive(
        TaskFilter(definition="three"), reason="three fixed", operator="ops"
    )
    assert plan.planned == 4
    preview = "\n".join(plan.effects())
    assert "redriven: 4 tasks" in preview, preview
    assert "effects called again: 4 (three (count.until_fixed): 4)" in preview, preview
    assert "effects not called again (recorded results kept): 8" in preview, preview
    # A task redriven alone after the plan was made has another token: it is not touched.
    FIXED["on"] = True
    await store.tasks.redrive(ids[0])
    await drain(store, THREE)
    applied = await store.bulk.apply(plan.id)
    assert (applied.applied, applied.moved, applied.refused) == (3, 1, 0), applied
    await drain(store, THREE)
    for task_id in ids:
        task = await store.tasks.get(task_id)
        assert task.state == "succeeded", (task, await store.tasks.events(task_id))
        assert await calls(store, task_id) == {"one#1": 1, "two#1": 1, "three#1": 2}
        assert await audit_task(store, task_id) == []
    events = [e for e in await store.tasks.events(ids[1]) if e["kind"] == "redriven"]
    assert len(events) == 1 and events[0]["worker_id"] == "ops", events
    assert events[0]["detail"]["plan"] == plan.id and events[0]["detail"]["reason"] == "three fixed"
    # Applied once: a second apply is refused, and acts on nothing.
    with pytest.raises(PlanRefused, match="applied already"):
        await store.bulk.apply(plan.id)
    moved = await store.bulk.not_acted_on(plan.id)
    assert [(row["task_id"], row["outcome"]) for row in moved] == [(ids[0], "moved")]


async def test_bulk_redrive_from_a_non_idempotent_step_is_refused_per_task_and_counted(
    store: Store,
) -> None:
    ids = await failed_threes(store, 3)
    plan = await store.bulk.plan_redrive(TaskFilter(definition="three"), from_step="two")
    preview = "\n".join(plan.effects())
    assert "redriven: 0 tasks" in preview, preview
    assert "refused, left as they are: 3 tasks" in preview, preview
    assert "3 tasks: step 'two' (count.work, two#1) is not idempotent" in preview, preview
    applied = await store.bulk.apply(plan.id)
    assert (applied.applied, applied.refused) == (0, 3), applied
    for task_id in ids:
        assert (await store.tasks.get(task_id)).state == "failed"
    reasons = await sql(
        store, "SELECT detail ->> 'reason' FROM toolkit_bulk_plan_tasks WHERE plan_id = %s",
        plan.id,
    )  # fmt: skip
    assert all("not idempotent" in reason for (reason,) in reasons), reasons
    # Named with --rerun, the same plan is allowed and the preview says so.
    FIXED["on"] = True
    plan = await store.bulk.plan_redrive(
        TaskFilter(definition="three"), from_step="two", rerun=["two"]
    )
    preview = "\n".join(plan.effects())
    assert "new idempotency key (--rerun): 3" in preview, preview
    assert (await store.bulk.apply(plan.id)).applied == 3
    await drain(store, THREE)
    for task_id in ids:
        assert (await store.tasks.get(task_id)).state == "succeeded"
        assert await calls(store, task_id) == {
            "one#1": 1, "two#1": 1, "two#2": 1, "three#1": 1, "three#2": 1,
        }  # fmt: skip


async def test_bulk_redrive_leaves_live_and_succeeded_tasks_alone(store: Store) -> None:
    (failed,) = await failed_threes(store, 1)
    FIXED["on"] = True
    (done,) = await deploy_submit(store, THREE, [{}])
    await drain(store, THREE)
    (queued,) = await deploy_submit(store, THREE, [{}])
    plan = await store.bulk.plan_redrive(TaskFilter(definition="three"))
    assert plan.planned == 1
    preview = "\n".join(plan.effects())
    assert "left alone (not failed or cancelled): 2 other matching tasks" in preview, preview
    assert (await store.bulk.apply(plan.id)).applied == 1
    assert (await store.tasks.get(failed)).state == "queued"
    assert (await store.tasks.get(done)).state == "succeeded"
    assert (await store.tasks.get(queued)).state == "queued"
