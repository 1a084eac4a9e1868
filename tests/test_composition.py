"""Parallel branches, map, races, budgets and child workflows, in-process against PostgreSQL."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

from tests.apps import counting
from tests.conftest import at_schema_version
from tests.inprocess import deploy_submit, drain, kinds, sql
from tests.processes import eventually
from tests.workflows import definition
from toolkit.application import SpendLedger, SpendMeter
from toolkit.store import Store
from toolkit.store.budgets import Budgets, ReservationOutcome
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio


async def calls(store: Store) -> dict[str, int]:
    return {key: n for key, n in await sql(store, "SELECT idempotency_key, calls FROM test_calls")}


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


# --- budgets ----------------------------------------------------------------------------------

SPEND = """
name: spend
version: 1
budget: {tokens: 100}
start: first
steps:
  first: {effect: count.spend, idempotent: true, args: {tokens: 60}, next: second}
  second: {effect: count.spend, idempotent: true, args: {tokens: 60}}
"""


async def test_an_effect_spending_past_the_budget_fails_with_a_budget_error(store: Store) -> None:
    (task_id,) = await deploy_submit(store, SPEND, [{}])
    await drain(store, SPEND)
    task = await store.tasks.get(task_id)
    assert task.state == "failed"
    assert task.error["name"] == "BudgetExceeded" and task.error["step"] == "second"
    assert len(await calls(store)) == 2  # not retried: a budget does not grow
    assert task.checkpoint["budget"]["tokens"]["spent"] == 120
    spend = [e["spend"] for e in await store.tasks.evidence(task_id)]
    assert spend == [{"tokens": 60}, {"tokens": 60}]


def test_a_spend_must_be_a_finite_number() -> None:
    meter = SpendMeter(dict, SpendLedger())
    for bad in (float("nan"), float("inf"), -1, "5", True):
        with pytest.raises(ValueError, match="must be a finite number >= 0"):
            meter.add({"tokens": bad})
    assert meter.spent == {}  # nothing recorded


async def test_a_submit_overrides_the_budget(store: Store) -> None:
    (task_id,) = await deploy_submit(store, SPEND, [{}], budget={"tokens": 500})
    await drain(store, SPEND)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded"
    assert task.checkpoint["budget"]["tokens"] == {"limit": 500, "spent": 120, "reserved": 0}


RESERVE = """
name: reserve
version: 1
start: fan
steps:
  fan:
    map:
      items: "${ input.items }"
      reserve: {per_branch: {tokens: 50}}
      branch:
        start: call
        steps:
          call: {effect: count.spend, idempotent: true, args: {tokens: "${ context.item }"}}
"""


async def set_tenant_budget(
    store: Store, tenant: str, amount: float, used: float = 0, reserved: float = 0
) -> None:
    """The tenant's ``tokens`` budget: ``used`` (spent plus reserved), ``reserved`` of it."""
    await sql(
        store,
        "INSERT INTO toolkit_tenants (tenant) VALUES (%s) ON CONFLICT DO NOTHING",
        tenant,
    )
    await sql(
        store,
        "INSERT INTO toolkit_tenant_budgets (tenant, resource, amount, used, reserved) "
        "VALUES (%s, 'tokens', %s, %s, %s) ON CONFLICT (tenant, resource) "
        "DO UPDATE SET amount = excluded.amount, used = excluded.used, "
        "reserved = excluded.reserved",
        tenant, amount, used, reserved,
    )  # fmt: skip


async def tenant_use(store: Store, tenant: str) -> tuple[float, float]:
    """The tenant's ``tokens`` use: (used, reserved)."""
    rows = await sql(
        store,
        "SELECT used::float8, reserved::float8 FROM toolkit_tenant_budgets"
        " WHERE tenant = %s AND resource = 'tokens'",
        tenant,
    )
    return rows[0]


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
    await sql(store, "UPDATE toolkit_tasks SET run_at = clock_timestamp() WHERE id = %s", task_id)
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


async def test_a_task_cancelled_after_its_worker_died_mid_step_returns_its_reservation(
    store: Store,
) -> None:
    """A worker reserved 100, recorded 40 spent and died; the operator cancels the task
    (its lease expired): the 60 not spent return to the tenant."""
    await set_tenant_budget(store, "acme", 1000)
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(d, [{"items": [1]}], tenant="acme")
    (task,) = await store.leases.claim("dead", [d.digest], 1, 60)
    fanout = {"occurrence": "fan#1", "branches": {}, "winner": None,
              "reserved": {"tokens": 100}, "spent": {"tokens": 40}}  # fmt: skip
    outcome, _ = await Budgets(store.db).reserve(
        task.fence("dead"), {"tokens": 100},
        {**task.checkpoint, "fanout": fanout}, f"{task.token}:1", {},
    )  # fmt: skip
    assert outcome is ReservationOutcome.RESERVED
    await sql(
        store,
        "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() WHERE id = %s",
        task_id,
    )
    assert await store.tasks.cancel(task_id) == "cancelled"
    assert await tenant_use(store, "acme") == (40, 0)


async def test_the_migration_counts_the_reservations_live_tasks_hold(empty_dsn: str) -> None:
    """Before schema 6 a tenant's use did not say what of it was reserved: the migration
    counts the reservations in live tasks' checkpoints (an ended task's count no more)."""
    at_schema_version(empty_dsn, 5)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO toolkit_tenants (tenant) VALUES ('acme')")
        conn.execute(
            "INSERT INTO toolkit_tenant_budgets (tenant, resource, amount, used)"
            " VALUES ('acme', 'tokens', 1000, 400), ('acme', 'usd', 5, 1)"
        )
        conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint, state, wait_reason)"
            " SELECT 'acme', 'x', 1, 'd', '{}', jsonb_build_object('fanout',"
            "   jsonb_build_object('reserved', jsonb_build_object('tokens', n))), s, r"
            " FROM (VALUES (100, 'waiting', 'reconciliation'), (50, 'queued', NULL),"
            "              (70, 'succeeded', NULL)) AS v(n, s, r)"
        )
    async with await Store.open(empty_dsn) as store:  # migrates
        assert await tenant_use(store, "acme") == (400, 150)
        budget = (await store.tenants.get("acme")).budgets["usd"]
        assert (budget.used, budget.reserved) == (1, 0)


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


async def test_a_budget_set_while_a_reservation_is_out_counts_only_the_spend(
    store: Store,
) -> None:
    """A reservation taken while the tenant had no tokens budget holds none of the budget
    set later: its release counts what it spent, and takes nothing back it never took."""
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    ended = []
    for items in ([10, 20], [5]):
        await store.tasks.submit(d, [{"items": items}], tenant="acme")
        (task,) = await store.leases.claim("w", [d.digest], 1, 60)
        fanout = {"occurrence": "fan#1", "branches": {}, "winner": None,
                  "reserved": {"tokens": 100}, "spent": {"tokens": float(sum(items))}}  # fmt: skip
        outcome, _ = await Budgets(store.db).reserve(
            task.fence("w"), {"tokens": 100},
            {**task.checkpoint, "fanout": fanout}, f"{task.token}:1", {},
        )  # fmt: skip
        assert outcome is ReservationOutcome.RESERVED  # no tokens budget: nothing taken
        ended.append((task, fanout))
    await set_tenant_budget(store, "acme", 1000)
    (first, fanout), (second, _) = ended
    # The step ends: the engine's release (30 spent, 100 returned).
    release = FencedWrite(
        first.fence("w"), {**first.checkpoint, "fanout": None}, state="succeeded",
        budget_delta={"tokens": -70.0}, budget_released={"tokens": 100.0},
    )  # fmt: skip
    assert await store.leases.commit(release) == "succeeded"
    assert await tenant_use(store, "acme") == (30, 0)
    # The task ends holding it (cancelled once its lease expired): the trigger's release.
    await sql(store, "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() WHERE id = %s",
              second.id)  # fmt: skip
    assert await store.tasks.cancel(second.id) == "cancelled"
    assert await tenant_use(store, "acme") == (35, 0)


async def test_a_reservation_that_can_never_fit_on_one_resource_is_not_deferred(
    store: Store,
) -> None:
    """``tokens`` is held by another task now, ``zeta`` can never give 1000: never, not later
    (though ``tokens`` comes first)."""
    await set_tenant_budget(store, "acme", 100, used=95, reserved=95)
    await sql(
        store,
        "INSERT INTO toolkit_tenant_budgets (tenant, resource, amount) VALUES ('acme', 'zeta', 50)",
    )
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{"items": [1]}], tenant="acme")
    (task,) = await store.leases.claim("w", [d.digest], 1, 60)
    outcome = await Budgets(store.db).reserve(
        task.fence("w"), {"tokens": 10, "zeta": 1000},
        task.checkpoint, f"{task.token}:1", {},
    )  # fmt: skip
    assert outcome == (ReservationOutcome.NEVER, "zeta")


async def test_concurrent_reservations_never_over_commit_a_tenant_budget(store: Store) -> None:
    """40 leased tasks race to reserve 100 each from a budget of 1,000: exactly 10 get it."""
    await set_tenant_budget(store, "acme", 1000)
    d = definition(RESERVE)
    await store.definitions.deploy(d)
    await store.tasks.submit(d, [{"items": [1]}] * 40, tenant="acme")
    claimed = await store.leases.claim("racer", [d.digest], 40, 60)
    assert len(claimed) == 40
    budgets = Budgets(store.db)
    outcomes: list[ReservationOutcome] = []

    async def reserve(task: Any) -> None:
        outcome, _ = await budgets.reserve(
            task.fence("racer"), {"tokens": 100},
            {**task.checkpoint, "reserved": True}, f"{task.token}:1", {},
        )  # fmt: skip
        outcomes.append(outcome)

    async with anyio.create_task_group() as group:
        for task in claimed:
            group.start_soon(reserve, task)
    assert outcomes.count(ReservationOutcome.RESERVED) == 10
    assert outcomes.count(ReservationOutcome.LATER) == 30
    assert await tenant_use(store, "acme") == (1000, 1000)


# --- child workflows --------------------------------------------------------------------------

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
        "UPDATE toolkit_tasks SET state = 'queued', wait_reason = NULL, run_at = clock_timestamp()"
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
    from tests.test_cli import invoke

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


CALLBACK_IN_BRANCH = """
name: callback-in-branch
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        ask:
          start: c
          steps:
            c: {effect: count.callback, idempotent: true, callback: {timeout: 1h}}
"""


async def test_show_prints_the_token_of_a_callback_awaited_in_a_branch(
    store: Store, dsn: str
) -> None:
    from tests.test_cli import invoke

    TOKENS = counting.TOKENS
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK_IN_BRANCH, [{}])
    async with anyio.create_task_group() as group:  # the worker ends once the task does
        group.start_soon(drain, store, CALLBACK_IN_BRANCH)

        async def awaited() -> bool:  # the branch waits, its token in the checkpoint
            task = await store.tasks.get(task_id)
            return bool(task.checkpoint.get("callbacks"))

        await eventually(awaited, what="the branch awaiting its callback")
        code, out, _ = await anyio.to_thread.run_sync(lambda: invoke("show", str(task_id), dsn=dsn))
        assert code == 0
        assert f"callback:   fan#1/ask/c#1 attempt 1: token {TOKENS[0]}" in out
        await store.tasks.complete(TOKENS[0], result="answered")
    assert (await store.tasks.get(task_id)).result == {"ask": "answered"}
