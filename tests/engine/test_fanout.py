"""Parallel and map steps, in-process against PostgreSQL: branch outputs and failures, races
(first success wins), maps with bounded concurrency, a step's budget reservations, and how
`toolkit show` prints branch progress (the store's side of budgets:
``tests/store/test_budgets.py``)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.apps import counting
from tests.helpers.inprocess import (
    calls,
    deploy_submit,
    drain,
    kinds,
    make_due,
    set_tenant_budget,
    sql,
    tenant_use,
)
from tests.helpers.processes import eventually
from tests.helpers.workflows import RESERVE
from toolkit.store import Store

pytestmark = pytest.mark.anyio


# --- parallel, mode all -----------------------------------------------------------------------

PARALLEL = """
name: parallel-all
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        left:
          start: a
          steps:
            a: {effect: count.work, idempotent: true, args: {value: "${ input.x }"}, next: b}
            b: {effect: count.work, idempotent: false, args: {value: "${ steps.a.value }"}}
        right:
          start: c
          steps:
            c: {effect: count.work, idempotent: true, args: {value: "${ context.branch }"}}
    next: done
  done: {succeed: {output: "${ steps.fan }"}}
"""


async def test_parallel_all_outputs_the_map_of_branch_outputs(store: Store) -> None:
    (task_id,) = await deploy_submit(store, PARALLEL, [{"x": 7}])
    report = await drain(store, PARALLEL)
    task = await store.tasks.get(task_id)
    assert report.succeeded == 1, task.error
    assert task.result["left"]["value"] == 7
    assert task.result["right"]["value"] == "right"
    assert await calls(store) == {
        f"{task_id}:fan#1/left/a#1": 1,
        f"{task_id}:fan#1/left/b#1": 1,
        f"{task_id}:fan#1/right/c#1": 1,
    }
    events = await kinds(store, task_id)
    assert events.count("branch_succeeded") == 2
    assert "fanout_started" in events and "fanout_ended" in events
    assert task.checkpoint.get("fanout") is None  # the step ended: no branch state left


FAILING = """
name: parallel-failing
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        good:
          start: a
          steps:
            a: {effect: count.work, idempotent: true}
        bad:
          start: b
          steps:
            b: {effect: count.fail, idempotent: true, args: {error: OutOfStock},
                retry: {max_attempts: 1}}
    next: done
    catch: [{errors: [OutOfStock], next: handled}]
  done: {succeed: {output: ok}}
  handled: {succeed: {output: "${ steps.fan.error }"}}
"""


async def test_a_failing_branch_fails_the_step_through_its_catch(store: Store) -> None:
    (task_id,) = await deploy_submit(store, FAILING, [{}])
    await drain(store, FAILING)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded"
    assert task.result["name"] == "OutOfStock"
    assert task.result["branch"] == "bad"
    assert task.result["step"] == "b"


INNER_CATCH = """
name: branch-catch
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        only:
          start: b
          steps:
            b: {effect: count.fail, idempotent: true, retry: {max_attempts: 1},
                catch: [{errors: ["*"], next: recover}]}
            recover: {succeed: {output: "${ steps.b.error.name }"}}
"""


async def test_a_catch_inside_a_branch_keeps_the_branch_going(store: Store) -> None:
    (task_id,) = await deploy_submit(store, INNER_CATCH, [{}])
    await drain(store, INNER_CATCH)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", {"only": "Broken"})


# --- first_success ----------------------------------------------------------------------------

RACE = """
name: race
version: 1
start: race
steps:
  race:
    parallel:
      mode: first_success
      cancel_losers: true
      branches:
        slow:
          start: s
          steps:
            s: {effect: count.work, idempotent: true, args: {seconds: 60, value: slow}}
        fast:
          start: f
          steps:
            f: {effect: count.work, idempotent: true, args: {value: fast}}
        broken:
          start: x
          steps:
            x: {effect: count.fail, idempotent: true, retry: {max_attempts: 1}}
"""


async def test_first_success_wins_and_cancels_the_losers(store: Store) -> None:
    (task_id,) = await deploy_submit(store, RACE, [{}])
    with anyio.fail_after(30):  # the slow branch would take 60 s if it were not cancelled
        await drain(store, RACE)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task.error
    assert task.result["value"] == "fast"
    events = await store.tasks.events(task_id)
    won = [e for e in events if e["kind"] == "race_won"]
    assert [e["detail"]["branch"] for e in won] == ["fast"]
    cancelled = [e["detail"]["branch"] for e in events if e["kind"] == "branch_cancelled"]
    assert cancelled == ["slow"]
    ended = next(e for e in events if e["kind"] == "fanout_ended")
    assert ended["detail"]["winner"] == "fast"


ALL_FAIL = """
name: race-lost
version: 1
start: race
steps:
  race:
    parallel:
      mode: first_success
      branches:
        a:
          start: x
          steps: {x: {effect: count.fail, idempotent: true, retry: {max_attempts: 1}}}
        b:
          start: y
          steps: {y: {fail: {error: Nope, message: no}}}
"""


async def test_a_race_nobody_wins_fails_with_every_branch_error(store: Store) -> None:
    (task_id,) = await deploy_submit(store, ALL_FAIL, [{}])
    await drain(store, ALL_FAIL)
    task = await store.tasks.get(task_id)
    assert task.state == "failed"
    assert task.error["name"] == "AllBranchesFailed"
    assert task.error["errors"]["a"]["name"] == "Broken"
    assert task.error["errors"]["b"]["name"] == "Nope"


# --- map --------------------------------------------------------------------------------------

MAP = """
name: map-items
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      max_concurrency: 2
      branch:
        start: work
        steps:
          work:
            effect: count.concurrent
            idempotent: true
            args: {value: "${ [context.index, context.item] }"}
"""


async def test_map_bounds_concurrency_and_keeps_item_order(store: Store) -> None:
    counting.CONCURRENCY.update(now=0, most=0)
    items = ["a", "b", "c", "d", "e", "f"]
    (task_id,) = await deploy_submit(store, MAP, [{"items": items}])
    await drain(store, MAP, concurrency=8)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task.error
    assert task.result == [[i, item] for i, item in enumerate(items)]
    assert counting.CONCURRENCY["most"] == 2
    assert len(await calls(store)) == 6


async def test_map_over_nothing_outputs_an_empty_list(store: Store) -> None:
    (task_id,) = await deploy_submit(store, MAP, [{"items": []}])
    await drain(store, MAP)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", [])


# --- reservations -----------------------------------------------------------------------------


async def test_a_reservation_is_taken_then_the_unspent_part_released(store: Store) -> None:
    await set_tenant_budget(store, "acme", 1000)
    (task_id,) = await deploy_submit(store, RESERVE, [{"items": [10, 20, 30]}], tenant="acme")
    await drain(store, RESERVE)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task.error
    assert await tenant_use(store, "acme") == (60, 0)  # reserved 150, spent 60, 90 returned
    reserved = [e for e in await store.tasks.events(task_id) if e["kind"] == "budget_reserved"]
    assert reserved[0]["detail"]["amounts"] == {"tokens": 150}


async def test_a_branch_spending_past_its_share_fails(store: Store) -> None:
    await set_tenant_budget(store, "acme", 1000)
    (task_id,) = await deploy_submit(store, RESERVE, [{"items": [10, 80]}], tenant="acme")
    await drain(store, RESERVE)
    task = await store.tasks.get(task_id)
    assert task.state == "failed"
    assert task.error["name"] == "BudgetExceeded" and task.error["branch"] == "1"
    assert await tenant_use(store, "acme") == (90, 0)  # both spends count; the rest returned


async def test_a_reservation_that_does_not_fit_now_defers_the_task(store: Store) -> None:
    await set_tenant_budget(store, "acme", 200, used=150, reserved=150)  # held elsewhere
    (task_id,) = await deploy_submit(store, RESERVE, [{"items": [1, 2]}], tenant="acme")
    report = await drain(store, RESERVE)
    task = await store.tasks.get(task_id)
    assert report.waiting == 1
    assert (task.state, task.wait_reason) == ("waiting", "budget")
    assert await calls(store) == {}  # no branch started
    await set_tenant_budget(store, "acme", 200, used=0)  # budget freed elsewhere
    await make_due(store, task_id)
    await drain(store, RESERVE)
    assert (await store.tasks.get(task_id)).state == "succeeded"
    assert await tenant_use(store, "acme") == (3, 0)


async def test_a_reservation_that_can_never_fit_fails_the_step(store: Store) -> None:
    await set_tenant_budget(store, "acme", 60)
    (task_id,) = await deploy_submit(store, RESERVE, [{"items": [1, 2]}], tenant="acme")
    await drain(store, RESERVE)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "BudgetExceeded"
    assert await calls(store) == {}


async def test_a_reservation_past_what_the_tenant_spent_for_good_fails_the_step(
    store: Store,
) -> None:
    """Of 200 tokens 150 are spent and none reserved: 100 can never fit, so the step fails
    rather than waiting for budget that no reservation will return."""
    await set_tenant_budget(store, "acme", 200, used=150)
    (task_id,) = await deploy_submit(store, RESERVE, [{"items": [1, 2]}], tenant="acme")
    await drain(store, RESERVE)
    task = await store.tasks.get(task_id)
    assert (task.state, task.error["name"]) == ("failed", "BudgetExceeded"), task.error
    assert await calls(store) == {}
    assert await tenant_use(store, "acme") == (150, 0)


# RESERVE with a minute-long call after the spend: the step is still running when cancelled.
RESERVE_SLOW = RESERVE.replace("name: reserve\n", "name: reserve-slow\n").replace(
    'args: {tokens: "${ context.item }"}}',
    'args: {tokens: "${ context.item }"},\n'
    "                 next: slow}\n"
    "          slow: {effect: count.work, idempotent: true, args: {seconds: 60}}",
)


async def test_a_task_cancelled_mid_step_returns_its_reservation(store: Store) -> None:
    """Cancelled while its branches run, the task keeps what they spent (10 + 20) charged
    and returns the rest of its reservation of 100 to the tenant."""
    await set_tenant_budget(store, "acme", 1000)
    (task_id,) = await deploy_submit(store, RESERVE_SLOW, [{"items": [10, 20]}], tenant="acme")

    async def two_slow_calls() -> bool:
        return len(await sql(store, "SELECT 1 FROM test_calls WHERE step = 'slow'")) == 2

    async with anyio.create_task_group() as group:
        group.start_soon(drain, store, RESERVE_SLOW)
        await eventually(two_slow_calls, what="both branches in their slow call")
        assert await tenant_use(store, "acme") == (100, 100)
        assert await store.tasks.cancel(task_id) == "requested"
    task = await store.tasks.get(task_id)
    assert task.state == "cancelled"
    assert await tenant_use(store, "acme") == (30, 0)
    assert task.checkpoint["fanout"]["reserved"] is None  # the task's own record says so too


@pytest.mark.parametrize(
    ("budget", "reserve"),
    [("", "      reserve: {total: {tokens: 100}}\n"), ("budget: {tokens: 100}\n", "")],
    ids=["a shared reservation", "the task's budget"],
)
async def test_concurrent_branches_never_spend_past_what_they_share(
    store: Store, budget: str, reserve: str
) -> None:
    """Two branches at once spend 80 each of the 100 they share: the second call's report
    sees the first's, so the step fails with BudgetExceeded (both spends still count)."""
    await set_tenant_budget(store, "acme", 1000)
    text = (
        f"name: shared\nversion: 1\n{budget}start: fan\nsteps:\n  fan:\n    map:\n"
        f"      items: '${{ input.items }}'\n{reserve}      branch:\n        start: call\n"
        "        steps:\n          call: {effect: count.spend, idempotent: true,"
        " args: {tokens: '${ context.item }'}}\n"
    )
    (task_id,) = await deploy_submit(store, text, [{"items": [80, 80]}], tenant="acme")
    await drain(store, text)
    task = await store.tasks.get(task_id)
    assert (task.state, task.error["name"]) == ("failed", "BudgetExceeded"), task.error
    assert await tenant_use(store, "acme") == (160, 0)


async def test_a_task_the_engine_fails_mid_step_returns_its_reservation(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine fault after the reservation's own write fails the task over its stored
    checkpoint, which records the reservation: the task's end returns it."""
    from toolkit.engine.steps.fanout import Branches

    def broken(*args: Any) -> None:
        raise RuntimeError("a fault of the engine")

    monkeypatch.setattr(Branches, "end", broken)
    await set_tenant_budget(store, "acme", 100)
    (task_id,) = await deploy_submit(store, RESERVE, [{"items": [10, 20]}], tenant="acme")
    await drain(store, RESERVE)
    task = await store.tasks.get(task_id)
    assert (task.state, task.error["name"]) == ("failed", "InternalError"), task.error
    assert await tenant_use(store, "acme") == (30, 0)


# --- toolkit show ------------------------------------------------------------------------------

BLOCKED = """
name: blocked-branch
version: 1
budget: {tokens: 1000}
start: fan
steps:
  fan:
    parallel:
      reserve: {per_branch: {tokens: 100}}
      branches:
        spender:
          start: s
          steps:
            s: {effect: count.spend, idempotent: true, args: {tokens: 30}}
        stuck:
          start: u
          steps:
            u: {effect: count.work, idempotent: false, args: {seconds: 5}, timeout: 0.05s}
"""


async def test_show_prints_branch_progress_reservations_and_spend(
    store: Store, dsn: str
) -> None:
    from tests.cli.test_cli import invoke

    (task_id,) = await deploy_submit(store, BLOCKED, [{}])
    await drain(store, BLOCKED)
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason) == ("waiting", "reconciliation")
    assert task.checkpoint["pending"] == "fan#1/stuck/u#1"
    code, out, _ = await anyio.to_thread.run_sync(lambda: invoke("show", str(task_id), dsn=dsn))
    assert code == 0
    assert "budget:     tokens: spent 0 of 1000, 200 reserved" in out
    assert "reserved  tokens 200 (spent 30)" in out
    assert "spender   succeeded" in out and "spent tokens 30" in out
    assert "stuck     blocked" in out and "uncertain fan#1/stuck/u#1" in out
    # The operator resolves the branch's effect: the step ends, the reservation is released.
    await store.tasks.reconcile(task_id, "u", "completed", result={"done": True})
    await drain(store, BLOCKED)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task.error
    assert task.result == {"spender": {"value": None, "tokens": 30}, "stuck": {"done": True}}
    assert task.checkpoint["budget"]["tokens"] == {"limit": 1000, "spent": 30, "reserved": 0}


LOST_ITEM = """
name: lost-item
version: 1
input: {type: object}
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      max_concurrency: 2
      branch:
        start: route
        steps:
          route:
            choice: [{when: "${ context.item == `0` }", next: hangs}]
            default: call
          hangs:
            effect: golden.hang_once
            idempotent: true
            retry: {max_attempts: 1}
          call: {effect: golden.echo, idempotent: true}
"""


async def test_a_branch_failed_by_its_lost_attempt_on_takeover_fails_the_step(
    store: Store,
) -> None:
    """Regression: a branch that its takeover failed (its only attempt lost with the lease)
    was not counted as ended, so the step, its other branch done, waited for ever."""
    from tests.apps import golden as golden_app
    from tests.helpers.golden import Run

    golden_app.HUNG.clear()
    run = Run(store, golden_app.app)
    (d,) = await run.deploy(LOST_ITEM)
    (task_id,) = await run.submit(d, {"items": [0, 1]})
    await run.crash_mid_call(task_id)  # item 0 hangs and its worker dies
    await run.drain()
    task = await store.tasks.get(task_id)
    events = [(e["kind"], e["detail"]) for e in await store.tasks.events(task_id)]
    assert task.state == "failed", (task.state, task.wait_reason, events)
    assert (task.error["name"], task.error["branch"]) == ("AttemptsExhausted", "0"), task.error
