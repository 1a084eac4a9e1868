"""Golden-history scenarios of each step kind: effects (crashes included), pure steps,
waits, callbacks, parallel and map steps, child workflows."""

from __future__ import annotations

from pathlib import Path

from tests.apps import golden as golden_app
from tests.helpers.golden import Run, scenario
from tests.helpers.inprocess import sql

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


FAILURE_CRASH = """
name: golden-failure-crash
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
            choice: [{when: "${ context.item == `1` }", next: hangs}]
            default: breaks
          breaks:
            effect: golden.flaky
            idempotent: true
            args: {fail_times: 9, error: Declined}
            retry: {max_attempts: 1}
          hangs: {effect: golden.hang_once, idempotent: true, args: {n: "${ context.item }"}}
"""


@scenario()
async def fanout_failure_survives_a_crash(run: Run) -> None:
    """Regression: a branch's failure was recorded after its end was committed, so a crash
    while a sibling still ran forgot it, and the resumed step succeeded with a null item."""
    (d,) = await run.deploy(FAILURE_CRASH)
    (task_id,) = await run.submit(d, {"items": [0, 1]})

    async def item_0_failed() -> bool:
        rows = await sql(
            run.store,
            "SELECT 1 FROM toolkit_branches WHERE task_id = %s AND name = '0'"
            " AND status = 'failed'",
            task_id,
        )
        return bool(rows)

    # item 0's failure is committed; item 1 hangs, and the worker dies
    await run.crash_mid_call(task_id, also=item_0_failed)
    await run.drain()
    task = await run.store.tasks.get(task_id)
    events = [(e["kind"], e["detail"]) for e in await run.store.tasks.events(task_id)]
    assert task.state == "failed", (task.state, task.error, task.result, events)
    assert (task.error["name"], task.error["branch"]) == ("Declined", "0"), task.error


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


# --- distributed map ----------------------------------------------------------------------

DISTRIBUTED = """
name: golden-distributed-map
version: 1
start: pages
steps:
  pages:
    map:
      distributed: true
      items_from: {effect: golden.pages}
      workflow: {name: golden-item}
      tolerated_failures: 1
    next: lines
  lines:
    map:
      distributed: true
      items_from: {file: items.jsonl, page_size: 3}
      workflow: {name: golden-item}
      items_per_task: 2
    next: done
  done: {succeed: {output: {pages: "${ steps.pages }", lines: "${ steps.lines }"}}}
"""

ITEM = """
name: golden-item
version: 1
input: {type: object}
start: call
steps:
  call: {effect: golden.echo, idempotent: true, args: {item: "${ input }"}}
"""


@scenario()
async def distributed_map(run: Run) -> None:
    """Pages from an effect (one item refused, tolerated), then batches from a file: the
    children start at each page, the parent waits (reason map) and counts them."""
    Path("items.jsonl").write_text('{"n": 0}\n{"n": 1}\n\n{"n": 2}\n{"n": 3}\n')
    parent, _ = await run.deploy(DISTRIBUTED, ITEM)
    (task_id,) = await run.submit(parent, {})
    await run.drain()
    task = await run.store.tasks.get(task_id)
    assert task.state == "succeeded", (task.state, task.error)
    assert task.result["pages"]["failed"] == 1 and task.result["lines"]["tasks"] == 3
