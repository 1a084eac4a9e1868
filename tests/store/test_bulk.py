"""Bulk plans: a plan records tokens and states; applying it touches only unchanged tasks,
once per (plan, task), in batches, and an apply that stopped half-way finishes the rest."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.citus import skip_kept_triggers
from tests.helpers.inprocess import deploy_submit, drain, leave_uncertain, make_due, sql
from tests.helpers.workflows import UNCERTAIN, definition
from toolkit.errors import InputError, PlanRefused, UnknownSignal
from toolkit.store import Store
from toolkit.store.filters import TaskFilter

pytestmark = pytest.mark.anyio

HOLD = """
name: hold
version: 1
input: {type: object}
start: hold
steps:
  hold:
    wait:
      signal: go
      schema: {type: object, properties: {by: {type: string, default: ops}}}
    next: done
  done: {succeed: {output: "${ steps.hold }"}}
"""

NO_WAIT = """
name: no-wait
version: 1
input: {type: object}
start: pause
steps:
  pause: {wait: {duration: 1h}}
"""


async def _signals(store: Store, task_id: int) -> list[Any]:
    return [(s["name"], s["payload"]) for s in await store.tasks.signals(task_id)]


async def _state(store: Store, task_ids: list[int]) -> str:
    """The tasks' states and tokens, for an assertion's message."""
    tasks = [await store.tasks.get(t) for t in task_ids]
    return ", ".join(f"{t.id}:{t.state}/{t.lease_token}" for t in tasks)


async def test_cancel_acts_only_on_tasks_unchanged_since_the_plan(store: Store) -> None:
    waiting = await deploy_submit(store, HOLD, [{}] * 12)
    await drain(store, HOLD)
    queued = await deploy_submit(store, HOLD, [{}] * 4)
    plan = await store.bulk.plan_cancel(TaskFilter(definition="hold"), operator="ana")
    assert plan.planned == 16 and plan.applied == 0
    assert sorted(plan.planned_counts) == [("queued", "hold", 1, 4), ("waiting", "hold", 1, 12)]
    # Since the plan: a worker finishes three (a signal, then a drain) and claims two.
    finished = waiting[:3]
    for task_id in finished:
        await store.tasks.signal(task_id, "go", {})
    await drain(store, HOLD)  # also runs the queued ones to their wait: they move too
    claimed = [t.id for t in await store.leases.claim("w2", [definition(HOLD).digest], 2, 30.0)]
    assert len(claimed) == 0  # none due: all waiting now; claim two by making them due
    await make_due(store, *waiting[3:5])
    claimed = [t.id for t in await store.leases.claim("w2", [definition(HOLD).digest], 2, 30.0)]
    assert sorted(claimed) == waiting[3:5]

    applied = await store.bulk.apply(plan.id, batch_size=5)
    unchanged = waiting[5:]
    assert (applied.applied, applied.moved, applied.left) == (len(unchanged), 9, 0), applied
    for task_id in unchanged:
        assert (await store.tasks.get(task_id)).state == "cancelled", await _state(store, [task_id])
    for task_id in finished:
        assert (await store.tasks.get(task_id)).state == "succeeded"
    for task_id in claimed:
        task = await store.tasks.get(task_id)
        assert (task.state, task.cancel_requested) == ("leased", None), task
    for task_id in queued:  # queued when planned, waiting now: moved, untouched
        assert (await store.tasks.get(task_id)).state == "waiting"
    moved = {row["task_id"] for row in await store.bulk.not_acted_on(plan.id, limit=100)}
    assert moved == {*finished, *claimed, *queued}
    # Every change names the operator and the plan.
    events = [e for e in await store.tasks.events(unchanged[0]) if e["kind"] == "cancelled"]
    assert [(e["worker_id"], e["detail"]["plan"]) for e in events] == [("ana", plan.id)]


async def test_a_leased_task_in_the_plan_is_asked_to_stop(store: Store) -> None:
    (task_id,) = await deploy_submit(store, HOLD, [{}])
    (claimed,) = await store.leases.claim("w", [definition(HOLD).digest], 1, 30.0)
    plan = await store.bulk.plan_cancel(TaskFilter(state="leased"))
    assert plan.effects()[0].startswith("asked to stop at their next durable point")
    applied = await store.bulk.apply(plan.id)
    assert applied.applied == 1
    task = await store.tasks.get(task_id)
    assert task.state == "leased" and task.cancel_requested["reason"] == "cancelled in bulk"
    assert claimed.id == task_id


async def test_a_signal_applied_again_after_a_crash_reaches_each_task_once(store: Store) -> None:
    ids = await deploy_submit(store, HOLD, [{}] * 30)
    await drain(store, HOLD)
    plan = await store.bulk.plan_signal(TaskFilter(definition="hold"), "go", {"n": 1})
    assert plan.arguments["payloads"] == {definition(HOLD).digest: {"n": 1, "by": "ops"}}

    class Crash(Exception):
        pass

    def crash_after_the_first_batch(settled: int) -> None:
        raise Crash  # the CLI dies here, between two batches

    with pytest.raises(Crash):
        await store.bulk.apply(plan.id, batch_size=8, progress=crash_after_the_first_batch)
    half = await store.bulk.get(plan.id)
    assert (half.applied, half.left, half.finished_at) == (8, 22, None), half
    done = await store.bulk.apply(plan.id, batch_size=8)
    assert (done.applied, done.left) == (30, 0) and done.finished_at is not None
    for task_id in ids:
        assert await _signals(store, task_id) == [("go", {"n": 1, "by": "ops"})], task_id
    with pytest.raises(PlanRefused, match=f"bulk plan {plan.id} was applied already"):
        await store.bulk.apply(plan.id)
    await drain(store, HOLD)
    assert {(await store.tasks.get(t)).state for t in ids} == {"succeeded"}


async def test_a_signal_reaches_only_the_tasks_unchanged_since_the_plan(store: Store) -> None:
    ids = await deploy_submit(store, HOLD, [{}] * 6)
    await drain(store, HOLD)
    plan = await store.bulk.plan_signal(TaskFilter(state="waiting"), "go", {"by": "plan"})
    # A worker finishes two of them meanwhile (their own signal, then a claim and a write).
    for task_id in ids[:2]:
        await store.tasks.signal(task_id, "go", {"by": "hand"})
    await drain(store, HOLD)
    applied = await store.bulk.apply(plan.id)
    assert (applied.applied, applied.moved) == (4, 2), applied
    for task_id in ids[:2]:
        assert await _signals(store, task_id) == [("go", {"by": "hand"})]
    for task_id in ids[2:]:
        assert await _signals(store, task_id) == [("go", {"by": "plan"})]


async def test_a_signal_no_matched_definition_waits_for_keeps_no_plan(store: Store) -> None:
    await deploy_submit(store, HOLD, [{}])
    await deploy_submit(store, NO_WAIT, [{}])
    with pytest.raises(UnknownSignal, match=r"no wait step of no-wait v1 waits for signal 'go'"):
        await store.bulk.plan_signal(TaskFilter(), "go")
    with pytest.raises(InputError, match=r"payload of signal 'go' for hold v1"):
        await store.bulk.plan_signal(TaskFilter(definition="hold"), "go", {"by": 5})
    assert await sql(store, "SELECT count(*) FROM toolkit_bulk_plans") == [(0,)]
    forced = await store.bulk.plan_signal(TaskFilter(), "go", {}, force=True)
    assert forced.planned == 2


async def test_reconcile_in_bulk_resolves_each_waiting_task(store: Store) -> None:
    ids = await leave_uncertain(store, 3)
    plan = await store.bulk.plan_reconcile(
        TaskFilter(wait_reason="reconciliation"), "charge", "completed", result={"value": "ok"}
    )
    assert plan.planned == 3
    unrelated = await store.bulk.plan_reconcile(TaskFilter(), "other", "retry")
    assert unrelated.planned == 0 and unrelated.finished_at is not None
    assert (await store.bulk.apply(plan.id)).applied == 3
    await drain(store, UNCERTAIN)
    for task_id in ids:
        task = await store.tasks.get(task_id)
        assert (task.state, task.result) == ("succeeded", {"value": "ok"}), task


async def test_an_unknown_plan_is_refused(store: Store) -> None:
    with pytest.raises(PlanRefused, match="there is no bulk plan 41"):
        await store.bulk.apply(41)


async def test_a_plan_item_the_previous_release_inserts_gets_its_tasks_tenant(
    request: pytest.FixtureRequest, store: Store
) -> None:
    """Migration 0035: the items carry their task's tenant (a plan's batch goes tenant by
    tenant); the previous release's insert does not name it, and a trigger gives it."""
    skip_kept_triggers(request.config, True)
    [task] = await deploy_submit(store, HOLD, [{}], tenant="acme")
    [(plan_id,)] = await sql(
        store,
        "INSERT INTO toolkit_bulk_plans (action, arguments, filter, operator)"
        " VALUES ('cancel', '{\"reason\": \"r\"}', '{}', 'ana') RETURNING id",
    )
    await sql(
        store,
        "INSERT INTO toolkit_bulk_plan_tasks (plan_id, task_id, lease_token, state)"
        " VALUES (%s, %s, 0, 'queued'), (%s, 999999, 0, 'queued') RETURNING task_id",
        plan_id, task, plan_id,
    )  # fmt: skip
    rows = await sql(
        store,
        "SELECT task_id, tenant FROM toolkit_bulk_plan_tasks WHERE plan_id = %s ORDER BY 1",
        plan_id,
    )
    assert rows == [(task, "acme"), (999999, "")]  # a task gone: the empty tenant, none's
    applied = await store.bulk.apply(plan_id)
    assert (applied.applied, applied.gone) == (1, 1), applied
