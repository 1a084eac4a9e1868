"""Compensation (sagas): a failed workflow undoes its completed steps in reverse order; a fail
step compensates only when it says so."""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import deploy_submit, drain, sql
from toolkit.application import EffectContext
from toolkit.store import Store

pytestmark = pytest.mark.anyio


@app.effect("count.undo")
async def undo(ctx: EffectContext, what: Any = None) -> Any:
    async with ctx.connection() as conn:
        await conn.execute(
            "INSERT INTO test_calls (idempotency_key, step, calls, last_token) "
            "VALUES (%s, %s, 1, %s) ON CONFLICT (idempotency_key) DO UPDATE "
            "SET calls = test_calls.calls + 1",
            (ctx.idempotency_key, f"undo:{what}", ctx.fencing_token),
        )
    return {"undone": what}


SAGA = """
name: saga
version: 1
start: reserve
steps:
  reserve:
    effect: count.work
    idempotent: true
    args: {value: stock}
    compensate: {effect: count.undo, args: {what: "${ steps.reserve.value }"}}
    next: charge
  charge:
    effect: count.work
    idempotent: false
    args: {value: card}
    compensate: {effect: count.undo, args: {what: card}, idempotent: false}
    next: ship
  ship:
    effect: count.fail
    idempotent: true
    args: {error: NoCourier}
    retry: {max_attempts: 1}
"""


async def test_a_failed_saga_compensates_completed_steps_in_reverse_order(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, SAGA, [{}])
    await drain(store, SAGA)
    task = await store.tasks.get(task_id)
    assert task.state == "failed"
    assert task.error["name"] == "NoCourier" and task.error["compensation"] == "completed"
    assert [c["result"]["undone"] for c in task.result["compensations"]] == ["card", "stock"]
    undone = await sql(store, "SELECT step, calls FROM test_calls WHERE step LIKE 'undo:%%'")
    assert sorted(undone) == [("undo:card", 1), ("undo:stock", 1)]
    evidence = [e["occurrence"] for e in await store.tasks.evidence(task_id)]
    assert "compensate/charge#1/charge#1" in evidence


FAIL_STEP = """
name: saga-fail-step
version: 1
start: reserve
steps:
  reserve:
    effect: count.work
    idempotent: true
    compensate: {effect: count.undo, args: {what: stock}}
    next: check
  check:
    choice: [{when: "${ input.compensate }", next: undo_all}]
    default: plain
  undo_all: {fail: {error: OutOfStock, compensate: true}}
  plain: {fail: {error: OutOfStock}}
"""


async def test_a_fail_step_compensates_only_when_it_says_so(store: Store) -> None:
    yes, no = await deploy_submit(store, FAIL_STEP, [{"compensate": True}, {"compensate": False}])
    await drain(store, FAIL_STEP)
    assert (await store.tasks.get(yes)).result["compensations"][0]["outcome"] == "completed"
    plain = await store.tasks.get(no)
    assert plain.state == "failed" and plain.result is None
