"""Nested fan-out: a parallel or map step inside a branch (issue 18; docs/composition.md).

The nested step's state lives in the frame of the branch holding it, its branches have
rows of their own, and the enclosing branch parks (waits_for ``branches``) once all of
them wait; a wake of a nested branch resumes the branches above it, and only them. Signals
reach a nested branch by its path of names (``0/approval``). Timers are made due by row
surgery (no sleeping).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.helpers.inprocess import (
    calls,
    deploy_submit,
    drain,
    kinds,
    make_due,
    sql,
    task_detail,
)
from toolkit.errors import InputError, SignalAmbiguous, UnknownSignal
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def rows(store: Store, task_id: int) -> dict[str, Any]:
    """The task's state and every branch row, keyed ``fanout/name`` (for assertions and
    their messages)."""
    task = await store.tasks.get(task_id)
    branches = await store.branches.of_task(task_id)
    return {
        "state": task.state,
        "wait_reason": task.wait_reason,
        "lease_owner": task.lease_owner,
        "error": task.error,
        "rows": {f"{b.fanout}/{b.name}": (b.status, b.waits_for) for b in branches},
    }


# --- a map of orders, each with a parallel of a check and an approval ------------------------

ORDERS = """
name: nested-orders
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.orders }"
      branch:
        start: checks
        steps:
          checks:
            parallel:
              branches:
                stock:
                  start: call
                  steps:
                    call: {effect: count.work, idempotent: false,
                           args: {value: "${ context.parent.item }"}}
                approval:
                  start: wait
                  steps:
                    wait: {wait: {signal: approved}, next: answer}
                    answer: {succeed: {output: "${ steps.wait.by }"}}
            next: summary
          summary:
            succeed:
              output: {order: "${ context.item }", checks: "${ steps.checks }"}
    next: done
  done: {succeed: {output: "${ steps.each }"}}
"""


async def test_nested_branches_wait_without_a_lease_and_take_signals_by_path(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, ORDERS, [{"orders": ["a", "b"]}])
    await drain(store, ORDERS)
    state = await rows(store, task_id)
    assert (state["state"], state["wait_reason"], state["lease_owner"]) == (
        "waiting", "branches", None
    ), state  # fmt: skip
    assert state["rows"] == {
        "each#1/0": ("waiting", ("branches",)),
        "each#1/1": ("waiting", ("branches",)),
        "each#1/0/checks#1/stock": ("succeeded", ()),
        "each#1/0/checks#1/approval": ("waiting", ("signal:approved",)),
        "each#1/1/checks#1/stock": ("succeeded", ()),
        "each#1/1/checks#1/approval": ("waiting", ("signal:approved",)),
    }, state
    with pytest.raises(SignalAmbiguous, match=r"0/approval, 1/approval"):
        await store.tasks.signal(task_id, "approved", {"by": "ann"})

    await store.tasks.signal(task_id, "approved", {"by": "bob"}, address="1/approval")
    await drain(store, ORDERS)
    state = await rows(store, task_id)
    assert state["wait_reason"] == "branches", state
    # item 1 ended, and with its nested step its nested rows went
    assert state["rows"] == {
        "each#1/0": ("waiting", ("branches",)),
        "each#1/1": ("succeeded", ()),
        "each#1/0/checks#1/stock": ("succeeded", ()),
        "each#1/0/checks#1/approval": ("waiting", ("signal:approved",)),
    }, state

    await store.tasks.signal(task_id, "approved", {"by": "ann"})  # one waits: it takes it
    await drain(store, ORDERS)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await rows(store, task_id)
    assert [item["order"] for item in task.result] == ["a", "b"]
    assert [item["checks"]["approval"] for item in task.result] == ["ann", "bob"]
    assert [item["checks"]["stock"]["value"] for item in task.result] == ["a", "b"]
    events = await store.tasks.events(task_id)
    waits = sorted(e["detail"]["branch"] for e in events if e["kind"] == "waiting"
                   and e["detail"].get("step") == "wait")  # fmt: skip
    assert waits == ["0/approval", "1/approval"], events  # events name nested branches by path
    assert await store.branches.of_task(task_id) == []
    assert sorted((await calls(store)).values()) == [1, 1]  # no effect ran twice


async def test_a_nested_branch_failing_fails_its_item_and_the_map(store: Store) -> None:
    rejecting = ORDERS.replace(
        "answer: {succeed: {output: \"${ steps.wait.by }\"}}",
        "answer: {fail: {error: missing-order-id, message: \"no id\"}}",
    )
    (task_id,) = await deploy_submit(store, rejecting, [{"orders": ["a", "b"]}])
    await drain(store, rejecting)
    await store.tasks.signal(task_id, "approved", {"by": "x"}, address="0/approval")
    await drain(store, rejecting)
    task = await store.tasks.get(task_id)
    assert task.state == "failed", await rows(store, task_id)
    assert (task.error["name"], task.error["branch"]) == ("missing-order-id", "0"), task.error
    cancelled = [e["detail"] for e in await store.tasks.events(task_id)
                 if e["kind"] == "branch_cancelled"]  # fmt: skip
    assert [c["branch"] for c in cancelled] == ["1"], cancelled


# --- a race between a nested map of polls and a deadline ------------------------------------

RACE = """
name: nested-race
version: 1
start: race
steps:
  race:
    parallel:
      mode: first_success
      branches:
        all_regions:
          start: regions
          steps:
            regions:
              map:
                items: "${ input.regions }"
                branch:
                  start: pause
                  steps:
                    pause: {wait: {duration: 1h}, next: check}
                    check: {effect: count.work, idempotent: true,
                            args: {value: "${ context.item }"}}
        deadline:
          start: wait
          steps:
            wait: {wait: {duration: 2h}, next: late}
            late: {succeed: {output: late}}
    next: done
  done: {succeed: {output: "${ steps.race }"}}
"""


async def nested_timer_due(store: Store, task_id: int, fanout_like: str) -> None:
    """Row surgery: the timers of the waiting branches whose step occurrence matches
    ``fanout_like`` (SQL LIKE) have passed, and the task is due."""
    await sql(
        store,
        "UPDATE toolkit_branches SET run_at = statement_timestamp()"
        " WHERE task_id = %s AND fanout LIKE %s AND status = 'waiting'",
        task_id,
        fanout_like,
    )
    await make_due(store, task_id)


async def test_a_nested_timer_wakes_only_its_branch_and_the_nested_map_wins(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, RACE, [{"regions": ["eu", "us", "ap"]}])
    await drain(store, RACE)
    state = await rows(store, task_id)
    assert state["rows"]["race#1/all_regions"] == ("waiting", ("branches",)), state
    assert state["rows"]["race#1/deadline"] == ("waiting", ()), state
    waiting = [k for k, v in state["rows"].items() if k.startswith("race#1/all_regions/")]
    assert len(waiting) == 3 and state["lease_owner"] is None, state

    await nested_timer_due(store, task_id, "race#1/all_regions/regions#1")
    await drain(store, RACE)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await rows(store, task_id)
    assert [r["value"] for r in task.result] == ["eu", "us", "ap"]
    events = await store.tasks.events(task_id)
    won = [e["detail"]["branch"] for e in events if e["kind"] == "race_won"]
    cancelled = [e["detail"]["branch"] for e in events if e["kind"] == "branch_cancelled"]
    assert (won, cancelled) == (["all_regions"], ["deadline"]), events
    assert await store.branches.of_task(task_id) == []


async def test_a_deadline_cancels_a_nested_map_still_waiting_and_drops_its_rows(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, RACE, [{"regions": ["eu", "us"]}])
    await drain(store, RACE)
    await nested_timer_due(store, task_id, "race#1")  # the deadline's timer
    await drain(store, RACE)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await rows(store, task_id)
    assert task.result == "late"
    assert await store.branches.of_task(task_id) == []  # the nested rows went with the step
    assert await calls(store) == {}  # no region was checked
    assert "branch_cancelled" in await kinds(store, task_id)


# --- a nested branch waiting for a child workflow ------------------------------------------

CHILD = """
name: nested-child
version: 1
start: work
steps:
  work: {wait: {signal: go}, next: done}
  done: {succeed: {output: child}}
"""

PARENT = """
name: nested-parent
version: 1
start: race
steps:
  race:
    parallel:
      mode: first_success
      branches:
        jobs:
          start: each
          steps:
            each:
              map:
                items: "${ input.jobs }"
                branch:
                  start: run
                  steps:
                    run: {workflow: {name: nested-child}}
        quick:
          start: wait
          steps:
            wait: {wait: {signal: stop}, next: stopped}
            stopped: {succeed: {output: stopped}}
"""


async def test_a_race_cancels_the_children_nested_branches_wait_for(store: Store) -> None:
    await deploy_submit(store, CHILD, [])
    (task_id,) = await deploy_submit(store, PARENT, [{"jobs": [1, 2]}])
    await drain(store, PARENT, CHILD)
    children = await sql(store, "SELECT id, state FROM toolkit_tasks WHERE parent_id = %s",
                         task_id)  # fmt: skip
    assert [state for _, state in children] == ["waiting", "waiting"], children
    await store.tasks.signal(task_id, "stop", None, address="quick")
    await drain(store, PARENT, CHILD)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "stopped"), await rows(store, task_id)
    children = await sql(store, "SELECT id, state FROM toolkit_tasks WHERE parent_id = %s",
                         task_id)  # fmt: skip
    assert [state for _, state in children] == ["cancelled", "cancelled"], children
    assert await store.branches.of_task(task_id) == []


async def test_show_and_the_notebook_list_nested_branches_by_their_address(
    store: Store, dsn: str
) -> None:
    from tests.cli.test_cli import invoke
    (task_id,) = await deploy_submit(store, ORDERS, [{"orders": ["a", "b"]}])
    await drain(store, ORDERS)
    code, out, _ = await anyio.to_thread.run_sync(lambda: invoke("show", str(task_id), dsn=dsn))
    assert code == 0, out
    assert "    0         waiting   at checks, waits for its waiting branches (below)" in out, out
    assert "      of each#1/0/checks#1, 2 begun, 1 ended" in out, out
    assert "      approval  waiting   at wait, waits for signal 'approved'" in out, out
    detail = await task_detail(store, task_id)
    assert ("waits for", "its waiting branches (2 of each#1)") in detail.fields()
    (table,) = [rows for title, _, rows in detail.tables() if title == "branches"]
    assert sorted(row[0] for row in table) == ["0", "0/approval", "0/stock", "1", "1/approval",
                                               "1/stock"], table  # fmt: skip


SCHEMAS = """
name: nested-schemas
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      branch:
        start: asks
        steps:
          asks:
            parallel:
              branches:
                a:
                  start: w
                  steps:
                    w: {wait: {signal: answer, schema: {type: object, required: [approved]}}}
                b:
                  start: w
                  steps:
                    w: {wait: {signal: answer, schema: {type: object, required: [score]}}}
"""


async def test_a_signal_payload_is_checked_against_the_schema_of_the_branch_it_goes_to(
    store: Store,
) -> None:
    """Regression: the first schema declared for the name was used, so branch b refused its
    own payloads and took a's."""
    (task_id,) = await deploy_submit(store, SCHEMAS, [{"items": [1]}])
    await drain(store, SCHEMAS)
    with pytest.raises(SignalAmbiguous, match=r"0/a, 0/b\): address one of them \(--branch 0/a"):
        await store.tasks.signal(task_id, "answer", {"score": 3})
    with pytest.raises(InputError, match='missing required field "score"'):
        await store.tasks.signal(task_id, "answer", {"approved": True}, address="0/b")
    await store.tasks.signal(task_id, "answer", {"score": 3}, address="0/b")
    await drain(store, SCHEMAS)
    with pytest.raises(InputError, match='missing required field "approved"'):
        await store.tasks.signal(task_id, "answer", {"score": 3})  # one waits: a's schema
    await store.tasks.signal(task_id, "answer", {"approved": True})
    await drain(store, SCHEMAS)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await rows(store, task_id)
    assert task.result == [{"a": {"approved": True}, "b": {"score": 3}}]


async def test_a_signal_to_an_address_no_branch_waits_at_is_refused_with_the_addresses(
    store: Store,
) -> None:
    """A typo in an address (or --item N for a nested branch) was stored and never taken."""
    (task_id,) = await deploy_submit(store, ORDERS, [{"orders": ["a"]}])
    await drain(store, ORDERS)
    refusal = r"no branch at .* waits for signal 'approved' \(branches waiting for it: N/approval;"
    for address in ("0", "approval", "0/stock", "0/nope", "0/approval/x", "x/approval"):
        with pytest.raises(UnknownSignal, match=refusal):
            await store.tasks.signal(task_id, "approved", {"by": "x"}, address=address)
    assert await store.tasks.signals(task_id) == []  # nothing was stored
    await store.tasks.signal(task_id, "approved", {"by": "x"}, address="7/approval")  # kept
    forced = await store.tasks.signal(task_id, "approved", {"by": "x"}, address="0", force=True)
    assert [s["address"] for s in await store.tasks.signals(task_id)] == ["7/approval", "0"]
    assert forced
