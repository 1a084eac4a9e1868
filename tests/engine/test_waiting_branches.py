"""Branches that wait, in-process against PostgreSQL (issue 18; docs/composition.md).

Timers, signals, callbacks and child workflows inside parallel branches and map items: a
branch that waits parks in its own row, the task waits (reason ``branches``) holding no
lease once every live branch does, and a wake resumes only the branches whose wait may
have ended. Signals are addressed to a branch or item; a task-wide one goes to the one
branch waiting for it and is refused when several are. Timers are made due by row surgery
(no sleeping): the branch row's ``run_at`` and the task's.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps import counting
from tests.helpers.inprocess import (
    branch_due,
    calls,
    deploy_submit,
    drain,
    due_in,
    kinds,
    set_tenant_budget,
    task_detail,
    tenant_use,
)
from toolkit.errors import SignalAmbiguous
from toolkit.store import Store

pytestmark = pytest.mark.anyio


async def parked(store: Store, task_id: int) -> dict[str, Any]:
    """The task's wait and lease columns, and its branch rows (for assertions and their
    messages)."""
    task = await store.tasks.get(task_id)
    branches = await store.branches.of_task(task_id)
    return {
        "state": task.state,
        "wait_reason": task.wait_reason,
        "lease_owner": task.lease_owner,
        "lease_expires_at": task.lease_expires_at,
        "branches": {b.name: (b.status, b.waits_for, b.run_at is not None) for b in branches},
        "error": task.error,
    }


# --- parallel approvals: each branch waits for its own signal ------------------------------

APPROVALS = """
name: approvals
version: 1
start: ask
steps:
  ask:
    parallel:
      branches:
        legal: &approver
          start: request
          steps:
            request: {effect: count.work, idempotent: false, args: {value: "${ context.branch }"},
                      next: answer}
            answer: {wait: {signal: approval}, next: decide}
            decide:
              choice:
                - when: "${ steps.answer.approved }"
                  next: approved
              default: rejected
            approved: {succeed: {output: "${ context.branch }"}}
            rejected: {fail: {error: Rejected, message: "rejected by ${ context.branch }"}}
        finance: *approver
        security: *approver
    next: done
  done: {succeed: {output: "${ steps.ask }"}}
"""


async def test_parallel_approvals_wait_without_a_lease_and_each_takes_its_own_signal(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, APPROVALS, [{}])
    await drain(store, APPROVALS)
    state = await parked(store, task_id)
    assert (state["state"], state["wait_reason"], state["lease_owner"]) == (
        "waiting", "branches", None
    ), state  # fmt: skip
    assert state["lease_expires_at"] is None, state
    waits = {name: row[:2] for name, row in state["branches"].items()}
    assert waits == {name: ("waiting", ("signal:approval",)) for name in
                     ("legal", "finance", "security")}, state  # fmt: skip
    with pytest.raises(SignalAmbiguous, match="3 branches waiting for signal 'approval'"):
        await store.tasks.signal(task_id, "approval", {"approved": True})
    for number, name in enumerate(["security", "legal"]):
        await store.tasks.signal(task_id, "approval", {"approved": True}, address=name)
        await drain(store, APPROVALS)
        state = await parked(store, task_id)
        assert state["branches"][name][0] == "succeeded", state
        assert state["wait_reason"] == "branches" and state["lease_owner"] is None, state
        assert sum(row[0] == "waiting" for row in state["branches"].values()) == 1 - number + 1
    # one branch waits: a signal to the task as a whole goes to it
    await store.tasks.signal(task_id, "approval", {"approved": True})
    await drain(store, APPROVALS)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await parked(store, task_id)
    assert task.result == {"legal": "legal", "finance": "finance", "security": "security"}
    assert await store.branches.of_task(task_id) == []  # the step ended: its rows are gone
    assert all(count == 1 for count in (await calls(store)).values())  # no effect ran twice


async def test_a_rejection_fails_the_step_and_cancels_the_branches_still_waiting(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, APPROVALS, [{}])
    await drain(store, APPROVALS)
    await store.tasks.signal(task_id, "approval", {"approved": False}, address="finance")
    await drain(store, APPROVALS)
    task = await store.tasks.get(task_id)
    assert task.state == "failed", await parked(store, task_id)
    assert task.error["name"] == "Rejected" and task.error["branch"] == "finance"
    events = await store.tasks.events(task_id)
    cancelled = sorted(e["detail"]["branch"] for e in events if e["kind"] == "branch_cancelled")
    assert cancelled == ["legal", "security"], events


async def test_a_signal_sent_before_any_branch_waits_is_kept_for_the_first_wait(
    store: Store,
) -> None:
    """And a branch takes the signal addressed to it before a task-wide one (regression:
    finance took the older task-wide signal and left its own to nobody)."""
    (task_id,) = await deploy_submit(store, APPROVALS, [{}])
    await store.tasks.signal(task_id, "approval", {"approved": True})  # nobody waits yet
    await store.tasks.signal(task_id, "approval", {"approved": True}, address="finance")
    await drain(store, APPROVALS)
    state = await parked(store, task_id)
    done = sorted(name for name, row in state["branches"].items() if row[0] == "succeeded")
    assert len(done) == 2 and "finance" in done, state
    signals = await store.tasks.signals(task_id)
    assert all(s["consumed_at"] is not None for s in signals), signals
    assert signals[1]["consumed_by"] == "ask#1/finance/answer#1", signals


# --- a race of a polling loop against a deadline branch ------------------------------------
# (the example definitions/poll-or-deadline.yaml waits 1 s and 3 s for real; here the timers
# are long and made due by row surgery, so that a slow machine cannot reorder them)

RACE = """
name: poll-race
version: 1
input:
  type: object
  properties: {ready_after: {type: integer}}
start: race
steps:
  race:
    parallel:
      mode: first_success
      branches:
        poll:
          start: check
          steps:
            check: {effect: count.poll, idempotent: true,
                    args: {ready_after: "${ input.ready_after }"}, next: ready}
            ready:
              choice:
                - when: "${ steps.check.ready }"
                  next: done
              default: pause
            pause: {wait: {duration: 1h}, next: check}
            done: {succeed: {output: {polled: "${ steps.check.polls }"}}}
        deadline:
          start: timer
          steps:
            timer: {wait: {duration: 2h}, next: late}
            late: {fail: {error: Timeout, message: the status never came}}
    next: finish
  finish: {succeed: {output: "${ steps.race }"}}
"""


async def test_a_polling_loop_that_wins_cancels_the_waiting_deadline(store: Store) -> None:
    (task_id,) = await deploy_submit(store, RACE, [{"ready_after": 3}])
    for _ in range(2):  # two polls not ready: both branches wait, no lease held
        await drain(store, RACE)
        state = await parked(store, task_id)
        assert (state["wait_reason"], state["lease_owner"], state["lease_expires_at"]) == (
            "branches", None, None
        ), state  # fmt: skip
        assert state["branches"]["poll"][0] == "waiting", state
        assert state["branches"]["deadline"] == ("waiting", (), True), state
        await branch_due(store, task_id, "poll")
    await drain(store, RACE)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await parked(store, task_id)
    assert task.result == {"polled": 3}
    events = await store.tasks.events(task_id)
    won = [e["detail"]["branch"] for e in events if e["kind"] == "race_won"]
    cancelled = [e["detail"]["branch"] for e in events if e["kind"] == "branch_cancelled"]
    assert (won, cancelled) == (["poll"], ["deadline"]), events


async def test_a_deadline_branch_that_fires_first_fails_the_race_of_a_slow_status(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, RACE, [{"ready_after": 100}])
    await drain(store, RACE)
    await branch_due(store, task_id, "deadline")
    await drain(store, RACE)
    state = await parked(store, task_id)
    # the deadline branch failed; a failed branch does not win a race: the poll waits on
    assert state["branches"]["deadline"][0] == "failed", state
    assert state["branches"]["poll"][0] == "waiting", state
    assert state["wait_reason"] == "branches", state


# --- a map of callbacks, each with its own timeout -----------------------------------------

RESTORES = """
name: restores
version: 1
start: each
steps:
  each:
    map:
      items: "${ input.files }"
      max_concurrency: 8
      branch:
        start: restore
        steps:
          restore:
            effect: count.callback
            idempotent: true
            callback: {timeout: 1h}
            retry: {max_attempts: 1}
            catch:
              - errors: [Timeout]
                next: expired
          expired: {succeed: {output: {file: "${ context.item }", restored: false}}}
    next: done
  done: {succeed: {output: "${ steps.each }"}}
"""


async def test_a_map_of_callbacks_each_times_out_on_its_own(store: Store) -> None:
    counting.TOKENS.clear()
    files = [f"f{index}.dat" for index in range(20)]
    (task_id,) = await deploy_submit(store, RESTORES, [{"files": files}])
    late = {"3", "11", "17"}
    done: set[str] = set()
    for _ in range(25):  # each round settles at least one item
        await drain(store, RESTORES)
        state = await parked(store, task_id)
        if state["state"] != "waiting":
            break
        waiting = [name for name, row in state["branches"].items() if row[0] == "waiting"]
        # max_concurrency counts waiting items: never more than 8 live at once
        assert 0 < len(waiting) <= 8, state
        assert state["lease_owner"] is None, state
        for name in waiting:
            if name in late:
                await branch_due(store, task_id, name)
            else:
                token = next(
                    b.waits_for[0].split(":", 1)[1]
                    for b in await store.branches.of_task(task_id)
                    if b.name == name
                )
                await store.tasks.complete(token, result={"file": files[int(name)]})
            done.add(name)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await parked(store, task_id)
    expired = [index for index, out in enumerate(task.result) if out.get("restored") is False]
    assert expired == [3, 11, 17], task.result
    assert task.result[0] == {"file": "f0.dat"}
    assert len(counting.TOKENS) == 20  # one callback per item: none asked again


# --- a branch waiting for a child workflow -------------------------------------------------

CHILD = """
name: branch-child
version: 1
start: work
steps:
  work: {effect: count.work, idempotent: true, args: {value: child}}
"""

PARENT = """
name: branch-parent
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        child:
          start: run
          steps:
            run: {workflow: {name: branch-child}}
        local:
          start: call
          steps:
            call: {effect: count.work, idempotent: true, args: {value: local}}
    next: done
  done: {succeed: {output: "${ steps.fan }"}}
"""


async def test_a_branch_waits_for_its_child_workflow(store: Store) -> None:
    await deploy_submit(store, CHILD, [])
    (task_id,) = await deploy_submit(store, PARENT, [{}])
    await drain(store, PARENT, CHILD)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await parked(store, task_id)
    assert task.result["child"]["value"] == "child"
    assert task.result["local"]["value"] == "local"
    assert "child_started" in await kinds(store, task_id)


async def test_the_notebook_detail_lists_each_branch_and_what_it_waits_for(store: Store) -> None:
    (task_id,) = await deploy_submit(store, APPROVALS, [{}])
    await drain(store, APPROVALS)
    await store.tasks.signal(task_id, "approval", {"approved": True}, address="legal")
    await drain(store, APPROVALS)
    detail = await task_detail(store, task_id)
    assert ("waits for", "its waiting branches (2 of ask#1)") in detail.fields()
    (rows,) = [rows for title, _, rows in detail.tables() if title == "branches"]
    assert [row[:4] for row in rows] == [
        ["legal", "succeeded", "-", "-"],
        ["finance", "waiting", "answer", "signal:approval"],
        ["security", "waiting", "answer", "signal:approval"],
    ], rows


# --- a reservation is held while branches wait ---------------------------------------------

RESERVING = """
name: reserving-wait
version: 1
start: fan
steps:
  fan:
    parallel:
      reserve: {total: {tokens: 300}}
      branches:
        spend:
          start: call
          steps:
            call: {effect: count.spend, idempotent: true, args: {tokens: 40}}
        hold:
          start: pause
          steps:
            pause: {wait: {duration: 1h}}
"""


async def test_a_reservation_is_held_while_branches_wait_and_returned_at_the_end(
    store: Store,
) -> None:
    await set_tenant_budget(store, "acme", 1000)
    (task_id,) = await deploy_submit(store, RESERVING, [{}], tenant="acme")
    await drain(store, RESERVING)
    state = await parked(store, task_id)
    assert state["wait_reason"] == "branches", state
    assert await tenant_use(store, "acme") == (300.0, 300.0)  # held, the spend inside it
    await branch_due(store, task_id, "hold")
    await drain(store, RESERVING)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", await parked(store, task_id)
    assert await tenant_use(store, "acme") == (40.0, 0.0)  # the unspent part came back


ADDRESSED_THEN_TOP = """
name: addressed-then-top
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        only:
          start: call
          steps:
            call: {effect: count.work, idempotent: true}
    next: top
  top: {wait: {signal: go}}
"""


async def test_a_signal_for_a_branch_does_not_wake_a_wait_of_the_task(store: Store) -> None:
    """Regression: a signal addressed to a branch, never taken, made every later task-level
    wait for its name due at once; the wait could never take it, so the task spun."""
    (task_id,) = await deploy_submit(store, ADDRESSED_THEN_TOP, [{}])
    await store.tasks.signal(task_id, "go", None, address="ghost", force=True)  # no such branch
    await drain(store, ADDRESSED_THEN_TOP)
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason) == ("waiting", "signal"), task
    assert await due_in(store, task_id) > 3600, task.run_at  # not due: nothing for it
