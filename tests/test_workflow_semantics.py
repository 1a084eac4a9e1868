"""Run-time semantics of the format's later constructs, in-process against PostgreSQL.

Error-filtered retries, callbacks, waiting for the first of several events, signal payload
schemas, workflow deadlines, context in expressions, set steps, compensation (sagas),
bounded loops and children pinned to the latest version.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.apps.counting import TOKENS, app
from tests.inprocess import deploy_submit, drain, due_in, kinds, make_due, sql
from tests.processes import eventually
from tests.workflows import definition
from toolkit.application import EffectContext
from toolkit.errors import CallbackRefused, InputError, TaskTerminal
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










# --- 1. error-filtered retries ----------------------------------------------------------------

FILTERED = """
name: filtered-retries
version: 1
start: call
steps:
  call:
    effect: count.flaky
    idempotent: true
    args: {fail_times: "${ input.fails }", error: "${ input.error }"}
    retry:
      - {errors: [Transient], max_attempts: unlimited, initial: 0.01s, max: 0.02s}
      - {errors: ["*"], max_attempts: 2, initial: 0.01s}
    catch: [{errors: ["*"], next: caught}]
  caught: {succeed: {output: "${ steps.call.error }"}}
"""


async def test_each_error_gets_its_own_retry_policy(store: Store) -> None:
    transient, business = await deploy_submit(
        store, FILTERED, [{"fails": 7, "error": "Transient"}, {"fails": 7, "error": "Declined"}]
    )
    await drain(store, FILTERED)
    ok = await store.tasks.get(transient)
    assert ok.state == "succeeded" and ok.result == {"attempt": 8}  # past any default limit
    caught = await store.tasks.get(business)
    assert caught.result["name"] == "Declined" and caught.result["attempts"] == 2


# --- 3. callbacks -----------------------------------------------------------------------------

CALLBACK = """
name: callback
version: 1
start: ask
steps:
  ask:
    effect: count.callback
    idempotent: true
    args: {complete_early: "${ input.early }"}
    callback: {timeout: 1h}
    retry: {max_attempts: 2, initial: 0.01s}
    catch: [{errors: ["*"], next: refused}]
  refused: {succeed: {output: "${ steps.ask.error.name }"}}
"""


async def test_a_callback_completes_its_step_from_outside(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason, task.lease_owner) == ("waiting", "callback", None)
    (token,) = TOKENS
    assert await store.tasks.complete(token, result={"approved": True}) == task_id
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", {"approved": True})
    with pytest.raises(CallbackRefused, match="completed"):
        await store.tasks.complete(token, result=1)
    with pytest.raises(CallbackRefused, match="no callback token"):
        await store.tasks.complete("cb_nonsense", result=1)


async def test_a_completion_before_the_handler_returns_is_kept(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": True}])
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "early")  # never waited


async def test_a_failed_callback_goes_through_retry_then_catch(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    await store.tasks.complete(TOKENS[-1], error="Rejected", message="no")
    await drain(store, CALLBACK)  # attempt 2: a new token
    assert len(TOKENS) == 2 and TOKENS[0] != TOKENS[1]
    await store.tasks.complete(TOKENS[-1], error="Rejected")
    await drain(store, CALLBACK)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "Rejected")


async def test_a_callback_that_never_comes_times_out_and_its_token_expires(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    await make_due(store, task_id)  # the hour has passed
    await drain(store, CALLBACK)
    with pytest.raises(CallbackRefused, match="expired"):
        await store.tasks.complete(TOKENS[0], result=1)
    assert len(TOKENS) == 2  # retried with a new token


# --- 4. the first of several events -----------------------------------------------------------

ANY = """
name: first-event
version: 1
start: wait
steps:
  wait:
    wait:
      any:
        - {signal: approve, next: approved}
        - {signal: reject, next: rejected}
        - {duration: 1d, next: expired}
  approved: {succeed: {output: "${ steps.wait }"}}
  rejected: {succeed: {output: rejected}}
  expired: {succeed: {output: expired}}
"""


async def test_the_first_signal_wins_and_only_it_is_consumed(store: Store) -> None:
    (task_id,) = await deploy_submit(store, ANY, [{}])
    await drain(store, ANY)
    assert (await store.tasks.get(task_id)).wait_reason == "signal"
    await store.tasks.signal(task_id, "approve", {"by": "ann"})
    await store.tasks.signal(task_id, "reject", None)
    await drain(store, ANY)
    task = await store.tasks.get(task_id)
    assert task.result == {"event": "approve", "payload": {"by": "ann"}}
    signals = {s["name"]: s["consumed_at"] is not None for s in await store.tasks.signals(task_id)}
    assert signals == {"approve": True, "reject": False}


async def test_the_timer_of_a_wait_for_any_fires_when_no_signal_came(store: Store) -> None:
    (task_id,) = await deploy_submit(store, ANY, [{}])
    await drain(store, ANY)
    assert 86000 < await due_in(store, task_id) <= 86400
    await make_due(store, task_id)
    await drain(store, ANY)
    assert (await store.tasks.get(task_id)).result == "expired"


# --- 5. signal payload schema -----------------------------------------------------------------

SCHEMA = """
name: signal-schema
version: 1
start: wait
steps:
  wait:
    wait:
      signal: approved
      schema:
        type: object
        required: [by]
        properties: {by: {type: string}, level: {type: integer, default: 1}}
"""


async def test_a_signal_failing_its_schema_is_refused_and_defaults_are_applied(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, SCHEMA, [{}])
    with pytest.raises(InputError, match=r"\$\.by") as refused:
        await store.tasks.signal(task_id, "approved", {"by": 7})
    assert refused.value.path == "$.by"
    assert await store.tasks.signals(task_id) == []  # not stored
    await store.tasks.signal(task_id, "approved", {"by": "ann"})
    await drain(store, SCHEMA)
    assert (await store.tasks.get(task_id)).result == {"by": "ann", "level": 1}


# --- 6. workflow deadline ---------------------------------------------------------------------

DEADLINE = """
name: deadline
version: 1
timeout: 1h
start: wait
steps:
  wait: {wait: {signal: never}, next: done}
  done: {succeed: {output: done}}
"""

ON_TIMEOUT = """
name: deadline-routed
version: 1
timeout: 1h
on_timeout: late
start: work
steps:
  work: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: done}
  done: {succeed: {output: done}}
  late: {succeed: {output: "${ steps.work.error.name }"}}
"""


async def test_a_waiting_task_fails_at_its_deadline(store: Store) -> None:
    (task_id,) = await deploy_submit(store, DEADLINE, [{}])
    await drain(store, DEADLINE)
    assert 3500 < await due_in(store, task_id) <= 3600  # a wait without end: at the deadline
    await sql(
        store, "UPDATE toolkit_tasks SET deadline_at = clock_timestamp(), run_at = "
        "clock_timestamp() WHERE id = %s", task_id,
    )  # fmt: skip
    await drain(store, DEADLINE)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "Timeout"
    assert "deadline_passed" in await kinds(store, task_id)


async def test_a_submit_overrides_the_deadline_and_a_queued_task_is_timed_out(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, DEADLINE, [{}], timeout=0.001)

    async def passed() -> bool:  # the database's clock passes a millisecond deadline
        rows = await sql(
            store, "SELECT deadline_at < clock_timestamp() FROM toolkit_tasks WHERE id = %s",
            task_id,
        )  # fmt: skip
        return bool(rows[0][0])

    await eventually(passed, what="the deadline passed")
    await drain(store, DEADLINE)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "Timeout"


async def test_a_running_step_is_stopped_at_the_deadline_and_on_timeout_taken(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, ON_TIMEOUT, [{"seconds": 60}], timeout=1)
    with anyio.fail_after(30):  # the step would run 60 s
        await drain(store, ON_TIMEOUT)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", "Timeout")
    rows = await sql(store, "SELECT deadline_at FROM toolkit_tasks WHERE id = %s", task_id)
    assert rows == [(None,)]  # met by on_timeout: cleared


# --- 7 and 8. context, templates and set steps ------------------------------------------------

CONTEXT = """
name: context
version: 1
start: name
steps:
  name:
    set:
      label: "order ${ input.id } for ${ context.tenant }"
      total: "${ sum(input.amounts) }"
    next: call
  call:
    effect: count.flaky
    idempotent: true
    args: {fail_times: 1}
    retry: {max_attempts: 3, initial: 0.01s}
    next: echo
  echo:
    effect: count.work
    idempotent: true
    args: {value: {attempt: "${ context.attempt }", started: "${ context.started_at }"}}
    next: pause
  pause: {wait: {duration: 1h}, next: again}
  again: {effect: count.work, idempotent: true, args: {value: "${ context.started_at }"}}
"""


async def test_context_set_steps_and_templates(store: Store) -> None:
    (task_id,) = await deploy_submit(store, CONTEXT, [{"id": 7, "amounts": [1, 2, 3]}])
    await drain(store, CONTEXT)
    task = await store.tasks.get(task_id)
    outputs = task.checkpoint["outputs"]
    assert outputs["name"] == {"label": "order 7 for default", "total": 6}
    assert outputs["echo"]["value"]["attempt"] == 1
    started = outputs["echo"]["value"]["started"]
    assert started is not None
    await make_due(store, task_id)
    await drain(store, CONTEXT)
    task = await store.tasks.get(task_id)
    assert task.result["value"] == started  # the same value after a resume


# --- 9. compensation --------------------------------------------------------------------------

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


# --- 10. loops --------------------------------------------------------------------------------

LOOP = """
name: loop
version: 1
max_steps: 12
start: work
steps:
  work: {effect: count.work, idempotent: true, args: {value: "${ context.attempt }"}, next: again}
  again:
    choice: [{when: "${ input.forever }", next: work}]
    default: done
  done: {succeed: {output: "${ steps.work }"}}
"""


async def test_each_loop_iteration_is_a_new_occurrence_and_a_runaway_loop_stops(
    store: Store,
) -> None:
    (runaway,) = await deploy_submit(store, LOOP, [{"forever": True}])
    await drain(store, LOOP)
    task = await store.tasks.get(runaway)
    assert task.state == "failed" and task.error["name"] == "MaxStepsExceeded"
    keys = [row[0] for row in await sql(store, "SELECT idempotency_key FROM test_calls")]
    assert len(keys) == len(set(keys)) == 6  # work#1 .. work#6, each its own key
    assert len(task.checkpoint["outputs"]) == 1  # only the latest output of each step


# --- 11. a child pinned to the latest version -------------------------------------------------

CHILD_V1 = """
name: versioned-child
version: 1
start: s
steps:
  s: {succeed: {output: 1}}
"""
CHILD_V2 = CHILD_V1.replace("version: 1", "version: 2").replace("output: 1", "output: 2")
PARENT = """
name: latest-parent
version: 1
start: call
steps:
  call: {workflow: {name: versioned-child}}
"""


async def test_a_child_without_a_version_is_pinned_to_the_latest(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD_V1))
    await store.definitions.deploy(definition(CHILD_V2))
    (task_id,) = await deploy_submit(store, PARENT, [{}])
    await drain(store, PARENT, CHILD_V1, CHILD_V2)
    task = await store.tasks.get(task_id)
    assert (task.state, task.result) == ("succeeded", 2)


SLOW_PARENT = """
name: slow-parent
version: 1
timeout: 1h
start: call
steps:
  call: {workflow: {name: versioned-child, version: 1}}
"""


async def test_a_parent_past_its_deadline_cancels_its_live_child(store: Store) -> None:
    await store.definitions.deploy(definition(CHILD_V1))
    (task_id,) = await deploy_submit(store, SLOW_PARENT, [{}])
    await drain(store, SLOW_PARENT)  # the child's definition is served by no worker here
    assert (await store.tasks.get(task_id)).wait_reason == "child"
    await sql(
        store, "UPDATE toolkit_tasks SET deadline_at = clock_timestamp(), run_at = "
        "clock_timestamp() WHERE id = %s", task_id,
    )  # fmt: skip
    await drain(store, SLOW_PARENT)
    parent = await store.tasks.get(task_id)
    assert parent.state == "failed" and parent.error["name"] == "Timeout"
    rows = await sql(store, "SELECT state FROM toolkit_tasks WHERE parent_id = %s", task_id)
    assert rows == [("cancelled",)]


# --- regressions found by a new user ------------------------------------------------------------

BRANCH_CALLBACK = """
name: branch-callback
version: 1
start: fan
steps:
  fan:
    parallel:
      branches:
        only:
          start: ask
          steps:
            ask:
              effect: count.callback
              idempotent: true
              callback: {timeout: 0.3s}
              retry: {max_attempts: 2, initial: 0.01s}
    catch: [{errors: [Timeout], next: gave_up}]
  gave_up: {succeed: {output: gave up}}
"""


async def test_each_attempt_of_a_callback_in_a_branch_waits_its_whole_timeout(
    store: Store,
) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, BRANCH_CALLBACK, [{}])
    started = anyio.current_time()
    await drain(store, BRANCH_CALLBACK)
    assert anyio.current_time() - started >= 0.6  # two attempts of 0.3 s, not one shared
    assert len(TOKENS) == 2
    assert (await store.tasks.get(task_id)).result == "gave up"


async def test_a_callback_of_an_ended_task_is_refused(store: Store) -> None:
    TOKENS.clear()
    (task_id,) = await deploy_submit(store, CALLBACK, [{"early": False}])
    await drain(store, CALLBACK)
    await store.tasks.cancel(task_id)
    with pytest.raises(CallbackRefused, match=f"task {task_id} .* is cancelled"):
        await store.tasks.complete(TOKENS[0], result=1)


async def test_budgets_and_timeouts_out_of_range_are_refused_at_submit(store: Store) -> None:
    d = definition(DEADLINE)
    await store.definitions.deploy(d)
    for budget in ({"tokens": float("nan")}, {"tokens": float("inf")}, {"tokens": 1e300}):
        with pytest.raises(InputError, match="budget 'tokens' must be a number"):
            await store.tasks.submit(d, [{}], budget=budget)
    for timeout in (float("nan"), 1e20, 0):
        with pytest.raises(InputError, match="timeout must be"):
            await store.tasks.submit(d, [{}], timeout=timeout)


TWO_WAITS = """
name: two-waits
version: 1
start: w1
steps:
  w1: {wait: {signal: a}, next: w2}
  w2: {wait: {signal: a, schema: {type: object}}}
"""


async def test_the_wait_a_task_is_at_decides_its_signals_schema(store: Store) -> None:
    (task_id,) = await deploy_submit(store, TWO_WAITS, [{}])
    await drain(store, TWO_WAITS)  # waiting at w1, which takes any payload
    await store.tasks.signal(task_id, "a", "anything")
    await drain(store, TWO_WAITS)  # now at w2: an object
    with pytest.raises(InputError, match='expected object, got string "anything"'):
        await store.tasks.signal(task_id, "a", "anything")
    await store.tasks.cancel(task_id)
    with pytest.raises(TaskTerminal):  # not a schema error: the task has ended
        await store.tasks.signal(task_id, "a", "anything")


async def test_a_callback_completion_names_its_error_as_catch_would(store: Store) -> None:
    with pytest.raises(InputError, match="is not a dotted name"):
        await store.tasks.complete("cb_whatever", error="not a name!")
