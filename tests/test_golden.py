"""Golden histories of every example definition and every step kind, crashes included.

Each scenario drives tasks through a real worker in this process (and, for a crash, a
worker that dies mid-call or a claim that is never followed by a write), then compares every
commit of every task — state, checkpoint, events, evidence — with its file under
``tests/corpus/golden/`` (see ``tests/golden.py``). The files pin what a task's progress
looks like at every commit, so a change to the interpreter that alters resumption shows as
a diff; they change only deliberately (``TOOLKIT_GOLDEN_UPDATE=1``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from psycopg.types.json import Jsonb

from tests.apps import golden as golden_app
from tests.golden import GOLDEN, compare, history, install_recorder
from tests.inprocess import FAST, make_due, sql
from tests.processes import eventually
from tests.workflows import definition
from toolkit.application import App
from toolkit.definition import WorkflowDefinition, load_definition
from toolkit.examples import app as examples_app
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.limits import LimitDeferral

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "definitions"
#: Seconds a scenario's worker may take to run out of due work (a hang fails the test).
DRAIN_DEADLINE = 60.0


class Run:
    """One scenario's store, definitions and workers."""

    def __init__(self, store: Store, app: App) -> None:
        self.store = store
        self.app = app
        self.definitions: dict[str, WorkflowDefinition] = {}

    async def deploy(self, *sources: str | Path) -> list[WorkflowDefinition]:
        loaded = []
        for source in sources:
            d = load_definition(source) if isinstance(source, Path) else definition(source)
            await self.store.definitions.deploy(d)
            self.definitions[d.digest] = d
            loaded.append(d)
        return loaded

    async def submit(self, d: WorkflowDefinition, *inputs: Any, **options: Any) -> list[int]:
        return await self.store.tasks.submit(d, list(inputs), **options)

    def worker(self, worker_id: str) -> Worker:
        return Worker(self.store, self.app, list(self.definitions.values()), worker_id=worker_id)

    async def drain(self, worker_id: str = "golden-1", **config: Any) -> None:
        """Run a worker until nothing is due now."""
        settings = {**FAST, "concurrency": 1, **config, "until_idle": True}
        supervisor = WorkflowSupervisor(self.worker(worker_id), SupervisorConfig(**settings))
        with anyio.fail_after(DRAIN_DEADLINE):
            await supervisor.run()

    async def due(self, *task_ids: int) -> None:
        for task_id in task_ids:
            await make_due(self.store, task_id)

    async def ghost_claim(self, task_id: int) -> None:
        """A worker claims the task and dies before writing anything (its lease expires)."""
        (claimed,) = await self.store.leases.claim("ghost", list(self.definitions), 1, 30.0)
        assert claimed.id == task_id, claimed
        await expire_lease(self.store, task_id)

    async def crash_mid_call(self, task_id: int, worker_id: str = "golden-crashed") -> None:
        """A worker runs the task into ``golden.hang_once`` and dies there (lease taken over).

        The worker stops claiming once the call hangs, its lease is expired by row surgery,
        and its heartbeat then finds the lease gone: its cycle ends without a write. (Every
        write the cycle makes before a call is applied before the call: none is in flight.)
        """
        hung = len(golden_app.HUNG)
        shutdown = CancellationToken()
        supervisor = WorkflowSupervisor(
            self.worker(worker_id), SupervisorConfig(**{**FAST, "concurrency": 1, "grace": 60.0})
        )
        with anyio.fail_after(DRAIN_DEADLINE):
            async with anyio.create_task_group() as group:
                group.start_soon(supervisor.run, shutdown)
                await eventually(
                    lambda: _hung_more_than(hung), timeout=15, what="a call to hang"
                )
                shutdown.cancel()  # claims nothing more; the hung cycle keeps its grace
                await expire_lease(self.store, task_id)
        assert supervisor.report.lease_lost == 1, supervisor.report

    async def state(self, task_id: int) -> str:
        return (await self.store.tasks.get(task_id)).state

    async def open_callback(self, task_id: int) -> str:
        rows = await sql(
            self.store,
            "SELECT token FROM toolkit_callbacks WHERE task_id = %s AND state = 'open'",
            task_id,
        )
        ((token,),) = rows
        return str(token)


async def _hung_more_than(count: int) -> bool:
    return len(golden_app.HUNG) > count


async def expire_lease(store: Store, task_id: int) -> None:
    await sql(
        store,
        "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() - interval '1 second'"
        " WHERE id = %s AND state = 'leased'",
        task_id,
    )


Scenario = Callable[[Run], Awaitable[None]]
SCENARIOS: dict[str, tuple[Scenario, App]] = {}


def scenario(app: App = golden_app.app) -> Callable[[Scenario], Scenario]:
    def register(func: Scenario) -> Scenario:
        SCENARIOS[func.__name__] = (func, app)
        return func

    return register


# --- the example definitions ------------------------------------------------------------------

ITEMS = [{"sku": "A-1", "qty": 2, "price": 9.5}, {"sku": "B-2", "qty": 1, "price": 120.0}]


@scenario(examples_app)
async def example_order_saga(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "order-saga.yaml")
    order = {"order_id": "ORD-2024-00001", "customer": "ann", "ship_to": "NL", "items": ITEMS}
    big = {**order, "order_id": "ORD-2024-00002", "items": [{"sku": "C", "qty": 3, "price": 900}]}
    await run.submit(d, order, big)
    await run.drain()


@scenario(examples_app)
async def example_order_saga_compensated(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "order-saga-compensated.yaml")
    paid = {"order_id": "o-1", "customer": "ann", "items": ITEMS}
    declined = {"order_id": "o-2", "items": [{"sku": "X", "qty": 1, "price": 20000}]}
    await run.submit(d, paid, declined)
    await run.drain()


@scenario(examples_app)
async def example_file_ingest(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "file-ingest.yaml")
    shutil.copy(EXAMPLES / "data" / "weather" / "tromso-2024.csv", "station.csv")
    await run.submit(d, {"path": "station.csv", "report_dir": "reports"})
    await run.drain()


@scenario(examples_app)
async def example_batch_map(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "batch-map.yaml")
    await run.submit(d, {"items": ["a", "bb", "ccc", "dddd", "eeeee"]})
    await run.drain()


@scenario(examples_app)
async def example_research_race(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "research-race.yaml")
    await run.submit(d, {"question": "why is the sky blue?", "slow_seconds": 0.5})
    await run.drain()


@scenario(examples_app)
async def example_parent_order(run: Run) -> None:
    parent, _ = await run.deploy(EXAMPLES / "parent-order.yaml", EXAMPLES / "payment.yaml")
    await run.submit(parent, {"order_id": "o-9", "amount": 12.5})
    await run.drain()


@scenario(examples_app)
async def example_approval_callback(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "approval-callback.yaml")
    approved, rejected = await run.submit(
        d, {"request_id": "r-1", "amount": 10}, {"request_id": "r-2", "amount": 99}
    )
    await run.drain()
    for task_id in (approved, rejected):
        await run.store.tasks.complete(await run.open_callback(task_id), result={"seen": True})
    await run.drain()
    await run.store.tasks.signal(approved, "approved", {"by": "bo"})
    await run.store.tasks.signal(rejected, "rejected", {"why": "too much"})
    await run.drain()


@scenario(examples_app)
async def example_poll_loop(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "poll-loop.yaml")
    (task_id,) = await run.submit(d, {"job_id": "job-2"})
    await run.drain()
    while await run.state(task_id) == "waiting":
        await run.due(task_id)
        await run.drain()


# --- effects -------------------------------------------------------------------------------

RETRIES = """
name: golden-retries
version: 1
defaults:
  retry: {max_attempts: 3, initial: 10ms, jitter: false}
start: flaky
steps:
  flaky:
    effect: golden.flaky
    idempotent: true
    args: {fail_times: 2}
    next: declined
  declined:
    effect: golden.flaky
    idempotent: false
    args: {fail_times: 9, error: Declined}
    retry: {max_attempts: 5, initial: 10ms, non_retryable: [Declined]}
    catch: [{errors: [Declined], next: note}]
  note:
    set: {declined: "${ steps.declined.error.name }", attempts: "${ steps.flaky.attempt }"}
    next: done
  done: {succeed: {output: "${ steps.note }"}}
"""

EXHAUSTED = """
name: golden-exhausted
version: 1
start: flaky
steps:
  flaky:
    effect: golden.flaky
    idempotent: true
    args: {fail_times: 5}
    retry: {max_attempts: 2, initial: 10ms, jitter: false}
"""


@scenario()
async def effect_retries_and_catch(run: Run) -> None:
    retries, exhausted = await run.deploy(RETRIES, EXHAUSTED)
    await run.submit(retries, {})
    await run.submit(exhausted, {})
    await run.drain()


CALLS = """
name: golden-calls
version: 1
start: first
steps:
  first: {effect: golden.hang_once, idempotent: true, args: {n: 1}, next: second}
  second: {effect: golden.hang_once, idempotent: false, args: {n: 2}, next: third}
  third: {effect: golden.echo, idempotent: true, args: {n: 3}}
"""


@scenario()
async def effect_crash_mid_call(run: Run) -> None:
    """An idempotent call lost to a crash is made again with its key; a non-idempotent one
    goes to reconciliation, and each resolution resumes as it says."""
    (d,) = await run.deploy(CALLS)
    tasks = []
    for _ in ("completed", "retried", "failed"):  # one at a time: each is the one claimed
        (task_id,) = await run.submit(d, {})
        await run.crash_mid_call(task_id)  # at `first`: called again after the takeover
        await run.crash_mid_call(task_id)  # at `second`: its intent has no outcome
        await run.drain()
        tasks.append(task_id)
    completed, retried, failed = tasks
    await run.store.tasks.reconcile(completed, "second", "completed", result={"by": "operator"})
    await run.store.tasks.reconcile(retried, "second", "retry")
    await run.store.tasks.reconcile(failed, "second", "failed", error="Declined")
    await run.drain()


LOST = """
name: golden-lost
version: 1
start: first
steps:
  first: {effect: golden.hang_once, idempotent: true, retry: {max_attempts: 2}, next: second}
  second: {effect: golden.echo, idempotent: true}
"""


@scenario()
async def effect_lost_attempts_exhaust_the_retries(run: Run) -> None:
    (d,) = await run.deploy(LOST)
    (task_id,) = await run.submit(d, {})
    await run.crash_mid_call(task_id)
    await run.ghost_claim(task_id)  # the second attempt is lost too
    await run.drain()


# --- pure steps ----------------------------------------------------------------------------

PURE = """
name: golden-pure
version: 1
input: {type: object, properties: {route: {type: string}}}
max_steps: 20
start: values
steps:
  values:
    set: {route: "${ input.route }", doubled: "${ [input.route, input.route] }"}
    next: route
  route:
    choice:
      - {when: "${ steps.values.route == 'ok' }", next: ok}
      - {when: "${ steps.values.route == 'fail' }", next: refuse}
      - {when: "${ steps.values.route == 'loop' }", next: values}
  ok: {succeed: {output: "${ steps.values }"}}
  refuse: {fail: {error: Refused, message: "route ${ steps.values.route }"}}
"""


@scenario()
async def pure_steps(run: Run) -> None:
    (d,) = await run.deploy(PURE)
    await run.submit(d, {"route": "ok"}, {"route": "fail"}, {"route": "nowhere"}, {"route": "loop"})
    await run.drain()


# --- waits ---------------------------------------------------------------------------------

WAITS = """
name: golden-waits
version: 1
start: pause
steps:
  pause: {wait: {duration: 1h}, next: until}
  until: {wait: {until: "2020-01-01T00:00:00+00:00"}, next: approval}
  approval:
    wait:
      signal: approved
      timeout: 1d
      schema: {type: object, properties: {by: {type: string}, level: {type: integer, default: 1}}}
    catch: [{errors: [Timeout], next: late}]
    next: done
  done: {succeed: {output: "${ steps.approval }"}}
  late: {succeed: {output: "${ steps.approval.error }"}}
"""

ANY = """
name: golden-any
version: 1
start: first
steps:
  first:
    wait:
      any:
        - {signal: yes, next: agreed}
        - {signal: no, next: refused}
        - {duration: 1h, next: expired}
  agreed: {succeed: {output: "${ steps.first }"}}
  refused: {succeed: {output: refused}}
  expired: {succeed: {output: "${ steps.first }"}}
"""


@scenario()
async def waits(run: Run) -> None:
    plain, any_ = await run.deploy(WAITS, ANY)
    signalled, timed_out = await run.submit(plain, {}, {})
    yes, expired = await run.submit(any_, {}, {})
    await run.drain()
    await run.due(signalled, timed_out)  # the hour has passed
    await run.drain()
    await run.store.tasks.signal(signalled, "approved", {"by": "ann"})
    await run.store.tasks.signal(yes, "yes", {"why": "fine"})
    await run.store.tasks.signal(yes, "no", None)  # second: never consumed
    await run.drain()
    await run.due(timed_out, expired)
    await run.drain()


CALLBACK = """
name: golden-callback
version: 1
start: ask
steps:
  ask:
    effect: golden.callback
    idempotent: true
    callback: {timeout: 1h}
    retry: {max_attempts: 2, initial: 10ms, jitter: false}
    catch: [{errors: ["*"], next: refused}]
    next: done
  done: {succeed: {output: "${ steps.ask }"}}
  refused: {succeed: {output: "${ steps.ask.error }"}}
"""


@scenario()
async def callbacks(run: Run) -> None:
    (d,) = await run.deploy(CALLBACK)
    completed, retried, timed_out = await run.submit(d, {}, {}, {})
    await run.drain()
    tasks = (completed, retried, timed_out)
    first = dict(zip(tasks, golden_app.CALLBACKS, strict=True))
    await run.store.tasks.complete(first[completed], result={"answer": 42})
    await run.store.tasks.complete(first[retried], error="Rejected", message="not now")
    await run.drain()
    await run.store.tasks.complete(golden_app.CALLBACKS[-1], result={"answer": "later"})
    await run.due(timed_out)
    await run.drain()
    await run.due(timed_out)
    await run.drain()


# --- parallel and map ---------------------------------------------------------------------

PARALLEL = """
name: golden-parallel
version: 1
budget: {tokens: 1000}
start: both
steps:
  both:
    parallel:
      reserve: {total: {tokens: 300}}
      branches:
        left:
          start: call
          steps:
            call: {effect: golden.spend, idempotent: true, args: {tokens: 100}, next: tag}
            tag: {set: {side: left}}
        right:
          start: call
          steps:
            call: {effect: golden.echo, idempotent: false, args: {side: right}}
    next: done
  done: {succeed: {output: "${ steps.both }"}}
"""

FAILING_BRANCH = """
name: golden-failing-branch
version: 1
start: both
steps:
  both:
    parallel:
      branches:
        good:
          start: call
          steps:
            call: {effect: golden.echo, idempotent: true}
        bad:
          start: call
          steps:
            call:
              effect: golden.flaky
              idempotent: true
              args: {fail_times: 9, error: Declined}
              retry: {max_attempts: 1}
    catch: [{errors: ["*"], next: caught}]
  caught: {succeed: {output: "${ steps.both.error }"}}
"""

RACE = """
name: golden-race
version: 1
start: race
steps:
  race:
    parallel:
      mode: first_success
      cancel_losers: true
      branches:
        fast:
          start: call
          steps:
            call: {effect: golden.echo, idempotent: true, args: {who: fast}}
        slow:
          start: call
          steps:
            call: {effect: golden.slow, idempotent: true, args: {seconds: 30}}
"""

MAP = """
name: golden-map
version: 1
input: {type: object}
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      max_concurrency: 2
      branch:
        start: call
        steps:
          call:
            effect: golden.flaky
            idempotent: true
            args: {fail_times: "${ context.item }", error: Declined}
            retry: {max_attempts: 1}
            catch: [{errors: [Declined], next: declined}]
            next: ok
          ok: {set: {index: "${ context.index }", item: "${ context.item }"}}
          declined: {set: {index: "${ context.index }", declined: true}}
    next: done
  done: {succeed: {output: "${ steps.each }"}}
"""


@scenario()
async def fanout(run: Run) -> None:
    parallel, failing, race, map_ = await run.deploy(PARALLEL, FAILING_BRANCH, RACE, MAP)
    await run.submit(parallel, {})
    await run.submit(failing, {})
    await run.submit(race, {})
    await run.submit(map_, {"items": [0, 1, 0, 1, 0]})
    await run.drain()


BRANCH_CRASH = """
name: golden-branch-crash
version: 1
input: {type: object}
start: each
steps:
  each:
    map:
      items: "${ input.items }"
      max_concurrency: 1
      branch:
        start: route
        steps:
          route:
            choice: [{when: "${ context.item == `2` }", next: hangs}]
            default: call
          call: {effect: golden.echo, idempotent: true, args: {n: "${ context.item }"}}
          hangs: {effect: golden.hang_once, idempotent: true, args: {n: "${ context.item }"}}
"""


@scenario()
async def fanout_crash_mid_branch(run: Run) -> None:
    (d,) = await run.deploy(BRANCH_CRASH)
    (task_id,) = await run.submit(d, {"items": [1, 2, 3]})
    await run.crash_mid_call(task_id)
    await run.drain()


# --- child workflows ----------------------------------------------------------------------

PARENT = """
name: golden-parent
version: 1
input: {type: object}
start: child
steps:
  child:
    workflow: {name: golden-child, input: {fail: "${ input.fail }"}}
    catch: [{errors: ["*"], next: failed}]
    next: done
  done: {succeed: {output: "${ steps.child }"}}
  failed: {succeed: {output: "${ steps.child.error }"}}
"""

CHILD = """
name: golden-child
version: 1
input: {type: object}
start: route
steps:
  route:
    choice: [{when: "${ input.fail }", next: refuse}]
    default: call
  call: {effect: golden.echo, idempotent: true, args: {child: true}}
  refuse: {fail: {error: ChildRefused, message: no}}
"""


@scenario()
async def child_workflows(run: Run) -> None:
    parent, _ = await run.deploy(PARENT, CHILD)
    await run.submit(parent, {"fail": False}, {"fail": True})
    await run.drain()


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
        "UPDATE toolkit_tasks SET deadline_at = clock_timestamp(), run_at = clock_timestamp()",
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
    await expire_lease(run.store, task.id)  # the ghost dies: its slot is free
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
    await expire_lease(run.store, requested)
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


# --- the test (after every scenario is registered) ---------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_golden_history(
    store: Store, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # files a scenario's handlers read or write, by relative path
    await install_recorder(store)
    func, app = SCENARIOS[name]
    golden_app.CALLBACKS.clear()
    golden_app.HUNG.clear()
    await func(Run(store, app))
    compare(name, await history(store))


# --- an old checkpoint still resumes ------------------------------------------------------

#: Scenarios whose tasks a worker finishes alone once they are due (no signal, completion or
#: crash to replay): their handlers and definitions.
RESUMABLE: dict[str, tuple[App, list[str | Path]]] = {
    "effect_retries_and_catch": (golden_app.app, [RETRIES, EXHAUSTED]),
    "pure_steps": (golden_app.app, [PURE]),
    "journey": (golden_app.app, [JOURNEY]),
    "fanout": (golden_app.app, [PARALLEL, FAILING_BRANCH, RACE, MAP]),
    "example_order_saga": (examples_app, [EXAMPLES / "order-saga.yaml"]),
    "example_order_saga_compensated": (examples_app, [EXAMPLES / "order-saga-compensated.yaml"]),
    "example_batch_map": (examples_app, [EXAMPLES / "batch-map.yaml"]),
    "example_research_race": (examples_app, [EXAMPLES / "research-race.yaml"]),
    "example_poll_loop": (examples_app, [EXAMPLES / "poll-loop.yaml"]),
}


def resume_points() -> list[tuple[str, str, int]]:
    """(scenario, task, commit) of every stored checkpoint between two cycles."""
    points = []
    for name in sorted(RESUMABLE):
        path = GOLDEN / f"{name}.json"
        if not path.exists():  # a new scenario: its history test writes the file first
            continue
        golden = json.loads(path.read_text())
        for task, recorded in golden.items():
            for index, commit in enumerate(recorded["commits"]):
                if index and commit.get("state") in ("queued", "waiting"):
                    points.append((name, task, index))
    return points


@pytest.mark.parametrize(("name", "task", "index"), resume_points())
async def test_a_stored_checkpoint_resumes_as_its_golden_history_goes_on(
    store: Store, name: str, task: str, index: int
) -> None:
    """The checkpoint a golden history holds at a commit between two cycles, put into a task
    of a fresh store, resumes into exactly the commits that followed it. A checkpoint format
    change must keep these passing (through a migration of old checkpoints)."""
    app, sources = RESUMABLE[name]
    recorded = json.loads((GOLDEN / f"{name}.json").read_text())[task]
    commit = recorded["commits"][index]
    await install_recorder(store)
    run = Run(store, app)
    by_name = {f"{d.name}@{d.version}": d for d in await run.deploy(*sources)}
    d = by_name[recorded["definition"]]
    task_id = int(task.split()[1])
    await sql(store, "INSERT INTO toolkit_tenants (tenant) VALUES (%s) ON CONFLICT DO NOTHING",
              recorded["tenant"])  # fmt: skip
    await sql(
        store,
        "INSERT INTO toolkit_tasks (id, tenant, definition_name, definition_version,"
        " definition_digest, input, checkpoint, state, wait_reason, lease_token, run_at)"
        " OVERRIDING SYSTEM VALUE"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, clock_timestamp())",
        task_id, recorded["tenant"], d.name, d.version, d.digest, Jsonb(recorded["input"]),
        Jsonb(commit["checkpoint"]), commit["state"], commit.get("wait_reason"),
        commit["token"],
    )  # fmt: skip
    await run.drain()
    while await run.state(task_id) == "waiting":
        await run.due(task_id)
        await run.drain()
    resumed = (await history(store))[task]["commits"][1:]
    assert json.dumps(resumed, indent=1, sort_keys=True, default=str) == json.dumps(
        recorded["commits"][index + 1 :], indent=1, sort_keys=True, default=str
    )
