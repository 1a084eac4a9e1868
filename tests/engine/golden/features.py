"""Golden-history scenarios of the features across step kinds: compensation, deadlines,
limits, budgets, cancellation, takeovers between steps, and one long journey."""

from __future__ import annotations

import anyio

from tests.apps import golden as golden_app
from tests.helpers.golden import DRAIN_DEADLINE, Run, scenario
from tests.helpers.inprocess import FAST, expire_leases, sql
from toolkit.application import App
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store.limits import LimitDeferral

# --- compensation, deadlines, limits, budgets, cancellation ----------------------------------

SAGA = """
name: golden-saga
version: 1
start: reserve
steps:
  reserve:
    effect: golden.echo
    idempotent: true
    args: {what: stock}
    compensate: {effect: golden.echo, idempotent: true, args: {undo: "${ steps.reserve.what }"}}
    next: charge
  charge:
    effect: golden.echo
    idempotent: false
    args: {what: card}
    compensate: {effect: golden.hang_once, idempotent: true, args: {undo: card}}
    next: ship
  ship:
    effect: golden.flaky
    idempotent: true
    args: {fail_times: 9, error: Declined}
    retry: {max_attempts: 1}
"""


@scenario()
async def compensation_with_a_crash(run: Run) -> None:
    (d,) = await run.deploy(SAGA)
    (task_id,) = await run.submit(d, {})
    await run.crash_mid_call(task_id)  # in the refund: resumed, then the release runs
    await run.drain()


DEADLINE = """
name: golden-deadline
version: 1
timeout: 1h
on_timeout: late
start: pause
steps:
  pause: {wait: {duration: 2h}, next: done}
  done: {succeed: {output: on time}}
  late: {effect: golden.echo, idempotent: true, args: {late: true}}
"""

HARD_DEADLINE = """
name: golden-hard-deadline
version: 1
timeout: 1h
start: pause
steps:
  pause: {wait: {signal: never}, next: done}
  done: {succeed: {output: on time}}
"""


@scenario()
async def deadlines(run: Run) -> None:
    soft, hard = await run.deploy(DEADLINE, HARD_DEADLINE)
    (late,) = await run.submit(soft, {})
    (failed,) = await run.submit(hard, {})
    await run.drain()
    await sql(
        run.store,
        "UPDATE toolkit_tasks SET deadline_at = now(), run_at = now()",
    )
    await run.drain()
    assert {await run.state(late), await run.state(failed)} == {"succeeded", "failed"}


LIMITED = """
name: golden-limited
version: 1
start: call
steps:
  call: {effect: golden.echo, idempotent: true, limits: [golden.one-at-a-time]}
"""

LIMIT_HOLDER = LIMITED.replace("golden-limited", "golden-limit-holder")

LIMITS = App("golden-limited")
LIMITS.add("golden.echo", golden_app.echo)
LIMITS.limit("golden.one-at-a-time", max_concurrency=1)


@scenario(LIMITS)
async def limit_deferral(run: Run) -> None:
    """A task whose limit is full waits (reason limit) and runs once the slot is free.

    The slot is held by a claim of another definition's task that dies holding it: the
    worker here does not run that definition, so it stops at the first deferral.
    """
    (holder,) = await run.deploy(LIMIT_HOLDER)
    await run.submit(holder, {})
    await run.store.limits.sync(LIMITS.limit_specs)
    (task,) = await run.store.leases.claim("ghost", [holder.digest], 1, 30.0)
    taken = await run.store.limits.acquire(
        task.fence("ghost"), "call#1", ("golden.one-at-a-time",), 0
    )
    assert not isinstance(taken, LimitDeferral)
    run.definitions.clear()
    (d,) = await run.deploy(LIMITED)
    (waiting,) = await run.submit(d, {})
    await run.drain()  # it waits for the slot the ghost holds
    assert (await run.store.tasks.get(waiting)).wait_reason == "limit"
    await expire_leases(run.store, task.id)  # the ghost dies: its slot is free
    await run.due(waiting)
    await run.drain()


BUDGETED = """
name: golden-budgeted
version: 1
start: both
steps:
  both:
    parallel:
      reserve: {total: {tokens: 50}}
      branches:
        only:
          start: call
          steps:
            call: {effect: golden.spend, idempotent: true, args: {tokens: 20}}
    catch: [{errors: [BudgetExceeded], next: over}]
  over: {succeed: {output: "${ steps.both.error }"}}
"""


@scenario()
async def budget_reservations(run: Run) -> None:
    (d,) = await run.deploy(BUDGETED)
    await run.store.tenants.set("rich", budgets={"tokens": 1000})
    await run.store.tenants.set("poor", budgets={"tokens": 10})
    await run.submit(d, {}, tenant="rich")
    await run.submit(d, {}, tenant="poor")
    await run.drain()


CANCELLABLE = """
name: golden-cancellable
version: 1
start: pause
steps:
  pause: {wait: {duration: 1h}, next: call}
  call: {effect: golden.echo, idempotent: true}
"""


@scenario()
async def cancellation(run: Run) -> None:
    (d,) = await run.deploy(CANCELLABLE)
    waiting, requested = await run.submit(d, {}, {})
    await run.drain()
    await run.store.tasks.cancel(waiting, "no longer needed")
    await run.due(requested)
    (claimed,) = await run.store.leases.claim("ghost", [d.digest], 1, 30.0)
    assert claimed.id == requested
    await run.store.tasks.cancel(requested, "stop it")
    await expire_leases(run.store, requested)
    await run.drain()


# --- takeovers at every other step kind ---------------------------------------------------

TAKEOVERS = """
name: golden-takeovers
version: 1
input: {type: object}
start: values
steps:
  values: {set: {n: 1}, next: route}
  route:
    choice: [{when: "${ input.fail }", next: refuse}]
    default: pause
  pause: {wait: {duration: 1h}, next: both}
  both:
    parallel:
      branches:
        a: {start: call, steps: {call: {effect: golden.echo, idempotent: true}}}
        b: {start: call, steps: {call: {effect: golden.echo, idempotent: false}}}
    next: child
  child: {workflow: {name: golden-waiting-child}, next: done}
  done: {succeed: {output: "${ steps.child }"}}
  refuse: {fail: {error: Refused, message: refused}}
"""

WAITING_CHILD = """
name: golden-waiting-child
version: 1
start: wait
steps:
  wait: {wait: {signal: go}}
"""


@scenario()
async def takeovers_between_steps(run: Run) -> None:
    """A claim that dies before its first write, at a set step, at a timer's end and at a
    child workflow step whose child has ended: the next claim resumes where the checkpoint
    says, and starts no second child."""
    d, child = await run.deploy(TAKEOVERS, WAITING_CHILD)
    (task_id,) = await run.submit(d, {"fail": False})
    await run.ghost_claim(task_id)  # at the set step
    await run.drain()
    await run.due(task_id)
    await run.ghost_claim(task_id)  # at the timer's end
    await run.drain()
    (child_id,) = [t.id for t in await run.store.tasks.list() if t.id != task_id]
    await run.store.tasks.signal(child_id, "go", {"from": "test"})
    children_only = Worker(run.store, run.app, [child], worker_id="golden-children")
    with anyio.fail_after(DRAIN_DEADLINE):  # the child ends and wakes its parent, which
        await WorkflowSupervisor(  # this worker does not run
            children_only, SupervisorConfig(**{**FAST, "concurrency": 1, "until_idle": True})
        ).run()
    await run.ghost_claim(task_id)  # at the child step, its child ended
    await run.drain()


JOURNEY = """
name: golden-journey
version: 1
budget: {tokens: 500}
defaults:
  retry: {max_attempts: 3, initial: 10ms, jitter: false}
start: values
steps:
  values: {set: {n: 2}, next: reserve}
  reserve:
    effect: golden.echo
    idempotent: true
    args: {what: stock}
    compensate: {effect: golden.echo, idempotent: true, args: {undo: stock}}
    next: pause
  pause: {wait: {duration: 1h}, next: charge}
  charge:
    effect: golden.flaky
    idempotent: false
    args: {fail_times: 1}
    compensate: {effect: golden.echo, idempotent: false, args: {undo: charge}}
    next: each
  each:
    map:
      items: "${ [`1`, `2`] }"
      max_concurrency: 1
      reserve: {per_branch: {tokens: 50}}
      branch:
        start: call
        steps:
          call: {effect: golden.spend, idempotent: true, args: {tokens: 10}}
    next: until
  until: {wait: {until: "2020-01-01T00:00:00+00:00"}, next: ship}
  ship:
    effect: golden.flaky
    idempotent: true
    args: {fail_times: 9, error: Unavailable}
    retry: {max_attempts: 2, initial: 10ms, jitter: false}
"""


@scenario()
async def journey(run: Run) -> None:
    """One task through a set, a compensable effect, a timer, a retried non-idempotent
    effect, a map with a reservation, a past deadline, retries that run out and the
    compensations: a checkpoint of almost every shape, stored between cycles."""
    (d,) = await run.deploy(JOURNEY)
    (task_id,) = await run.submit(d, {})
    await run.drain()
    while await run.state(task_id) == "waiting":
        await run.due(task_id)
        await run.drain()
