"""Effect steps in-process against PostgreSQL: evidence, retries (by error too), catch,
timeouts and handler faults, reconciliation of an uncertain call, lost attempts, sync
handlers and the spend of a task's budget (callbacks: ``test_callbacks.py``)."""

from __future__ import annotations

import logging
import traceback
from typing import Any

import anyio
import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import (
    FAST,
    calls,
    deploy_submit,
    drain,
    due_in,
    leave_uncertain,
    run_until_idle,
    sql,
    submit,
)
from tests.helpers.processes import eventually
from tests.helpers.workflows import FIVE_SLOW_STEPS, THREE_STEPS, UNCERTAIN, definition
from toolkit.application import App, EffectContext
from toolkit.engine import Interpreter
from toolkit.errors import NotReconcilable
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio


# --- evidence ---------------------------------------------------------------------------------


async def test_multi_step_workflow_with_choice_succeeds_and_records_evidence(store: Store) -> None:
    ids = await submit(store, THREE_STEPS, [{"n": 5}, {"n": 0}])
    report = await run_until_idle(store, THREE_STEPS)
    assert report.succeeded == 2 and report.failed == 0
    five, zero = [await store.tasks.get(i) for i in ids]
    assert five.state == "succeeded" and five.result["value"] == 5
    assert zero.state == "succeeded" and zero.result == "zero"
    evidence = await store.tasks.evidence(ids[0])
    # Idempotent effects need no intent record; the non-idempotent one has started + completed.
    assert [(e["step"], e["record"]) for e in evidence] == [
        ("first", "completed"),
        ("second", "started"),
        ("second", "completed"),
        ("third", "completed"),
    ]
    assert {e["fencing_token"] for e in evidence} == {1}
    assert len({e["idempotency_key"] for e in evidence}) == 3
    assert all(n == 1 for n in (await calls(store)).values())
    kinds = [e["kind"] for e in await store.tasks.events(ids[0])]
    assert kinds == ["submitted", "claimed", "succeeded"]


# --- retries ----------------------------------------------------------------------------------

RETRYING = """
name: retrying
version: 1
input: {type: object}
start: flaky
steps:
  flaky:
    effect: count.flaky
    idempotent: true
    args: {fail_times: "${ input.fail_times }", error: "${ input.error }"}
    retry: {max_attempts: 3, initial: 10ms, factor: 2, max: 50ms, non_retryable: [Fatal]}
"""


async def test_retry_releases_the_lease_and_succeeds_then_exhausts(store: Store) -> None:
    ok, exhausted, fatal = await submit(
        store,
        RETRYING,
        [
            {"fail_times": 2, "error": "Transient"},
            {"fail_times": 5, "error": "Transient"},
            {"fail_times": 5, "error": "Fatal"},
        ],
    )
    report = await run_until_idle(store, RETRYING)
    assert report.retried == 4
    assert (await store.tasks.get(ok)).state == "succeeded"
    failed = await store.tasks.get(exhausted)
    assert failed.state == "failed"
    assert failed.error["name"] == "Transient" and failed.error["attempts"] == 3
    fatal_task = await store.tasks.get(fatal)
    assert fatal_task.state == "failed" and fatal_task.error["attempts"] == 1
    events = [e["kind"] for e in await store.tasks.events(ok)]
    assert events.count("retry_scheduled") == 2 and events.count("claimed") == 3
    records = [e["record"] for e in await store.tasks.evidence(ok)]
    assert records == ["failed", "failed", "completed"]


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


RETRY_LATER = """
name: retry-later
version: 1
input: {type: object}
start: step
steps:
  step:
    effect: count.flaky
    idempotent: true
    args: {fail_times: "${ input.fail_times }"}
    retry: {max_attempts: 3, initial: 30s, jitter: false}
"""


async def test_a_task_waiting_on_a_retry_timer_holds_no_lease_and_blocks_nothing(
    store: Store,
) -> None:
    (first,) = await deploy_submit(store, RETRY_LATER, [{"fail_times": 1}])
    worker = Worker(store, app, [definition(RETRY_LATER)])
    shutdown = CancellationToken()
    second = 0

    async def submit_after_the_retry_is_scheduled() -> None:
        nonlocal second

        async def retry_scheduled() -> bool:
            task = await store.tasks.get(first)
            return task.attempts >= 1 and task.state == "queued"

        async def second_done() -> bool:
            return (await store.tasks.get(second)).state == "succeeded"

        await eventually(retry_scheduled, what="the retry timer")
        (second,) = await store.tasks.submit(definition(RETRY_LATER), [{"fail_times": 0}])
        await eventually(second_done, what="the second task")
        shutdown.cancel()

    with anyio.fail_after(20):  # far less than the 30 s retry timer
        async with anyio.create_task_group() as tg:
            tg.start_soon(submit_after_the_retry_is_scheduled)
            await WorkflowSupervisor(worker, SupervisorConfig(concurrency=1, **FAST)).run(shutdown)
    waiting = await store.tasks.get(first)
    assert waiting.state == "queued" and waiting.lease_owner is None
    assert 25 < await due_in(store, first) <= 30


async def test_a_crash_between_effects_counts_as_one_lost_attempt(store: Store) -> None:
    """Regression: the attempt written before an idempotent call was counted twice on takeover."""
    text = """
name: two
version: 1
input: {type: object}
start: a
steps:
  a: {effect: count.work, idempotent: true, next: b}
  b: {effect: count.work, idempotent: true, retry: {max_attempts: 2, initial: 10ms}}
"""
    (task_id,) = await deploy_submit(store, text, [{}])
    d = definition(text)
    crashing = App("crashing")

    class Crash(BaseException):
        pass

    @crashing.effect("count.work")
    async def work(ctx: Any) -> dict[str, Any]:
        if ctx.step == "b":
            raise Crash
        return {}

    (task,) = await store.leases.claim("dead", [d.digest], 1, 30.0)
    with pytest.raises(Crash):
        await Interpreter(store, crashing, "dead").execute(task, d)
    await sql(
        store, "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() - interval '1s'"
    )
    await drain(store, text)
    task_record = await store.tasks.get(task_id)
    assert task_record.state == "succeeded", task_record.error


# --- catch ------------------------------------------------------------------------------------

CAUGHT = """
name: caught
version: 1
input: {type: object}
start: flaky
steps:
  flaky:
    effect: count.flaky
    idempotent: true
    args: {fail_times: 9, error: "${ input.error }"}
    retry: {max_attempts: 2, initial: 10ms}
    catch:
      - errors: [OutOfStock]
        next: restock
    next: done
  restock:
    succeed:
      output: "caught ${ steps.flaky.error.name } after ${ steps.flaky.error.attempts }"
  done: {succeed: {}}
"""


async def test_catch_routes_a_final_error_with_the_error_as_data(store: Store) -> None:
    caught, uncaught = await deploy_submit(
        store, CAUGHT, [{"error": "OutOfStock"}, {"error": "Other"}]
    )
    await drain(store, CAUGHT)
    assert (await store.tasks.get(caught)).result == "caught OutOfStock after 2"
    failed = await store.tasks.get(uncaught)
    assert failed.state == "failed" and failed.error["name"] == "Other"
    assert "caught" in [e["kind"] for e in await store.tasks.events(caught)]


# --- timeouts and faults of handlers ----------------------------------------------------------

FAULTS = """
name: faults
version: 1
input: {type: object}
start: route
steps:
  route:
    choice:
      - when: "${ input.kind == 'json' }"
        next: bad_json
      - when: "${ input.kind == 'timeout_idem' }"
        next: slow_idem
      - when: "${ input.kind == 'timeout_nonidem' }"
        next: slow_nonidem
      - when: "${ input.kind == 'fail' }"
        next: refuse
  bad_json: {effect: count.not_json, idempotent: true}
  slow_idem: {effect: count.work, idempotent: true, args: {seconds: 5}, timeout: 0.05s}
  slow_nonidem: {effect: count.work, idempotent: false, args: {seconds: 5}, timeout: 50ms}
  refuse: {fail: {error: Refused, message: "refused ${ input.kind }"}}
"""


async def test_faults_end_in_clear_states(store: Store) -> None:
    kinds = ["json", "timeout_idem", "timeout_nonidem", "fail", "none"]
    ids = await submit(store, FAULTS, [{"kind": k} for k in kinds])
    await run_until_idle(store, FAULTS)
    tasks = {k: await store.tasks.get(i) for k, i in zip(kinds, ids, strict=True)}
    assert tasks["json"].state == "failed" and tasks["json"].error["name"] == "ResultNotJson"
    assert "bad_json" in tasks["json"].error["message"]
    assert (
        tasks["timeout_idem"].state == "failed" and tasks["timeout_idem"].error["name"] == "Timeout"
    )
    # A non-idempotent call that timed out is uncertain: fail closed, never retried.
    assert tasks["timeout_nonidem"].state == "waiting"
    assert tasks["timeout_nonidem"].wait_reason == "reconciliation"
    assert tasks["fail"].state == "failed"
    assert tasks["fail"].error == {"name": "Refused", "message": "refused fail", "step": "refuse"}
    assert tasks["none"].state == "failed" and tasks["none"].error["name"] == "NoChoiceMatched"


RAISING = App("raising")


@RAISING.effect("raise.sync")
def raise_in_a_thread(ctx: EffectContext, order: str) -> None:
    raise LookupError(f"no order {order}")  # the line a user must find


async def test_a_failed_attempt_is_logged_with_the_handler_traceback(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a handler's exception left only its name and message, in the store."""
    text = """
name: raising
version: 1
input: {type: object}
start: a
steps:
  a:
    effect: raise.sync
    idempotent: true
    args: {order: "${ input.order }"}
    retry: {max_attempts: 2, initial: 10ms}
"""
    caplog.set_level(logging.WARNING, logger="toolkit")
    (task_id,) = await deploy_submit(store, text, [{"order": "A-1"}])
    await drain(store, text, handlers=RAISING)
    failed = [r for r in caplog.records if r.__dict__.get("action") == "effect_failed"]
    assert [(r.levelno, r.attempt) for r in failed] == [(logging.WARNING, 1), (logging.WARNING, 2)]
    first = failed[0]
    assert (first.task_id, first.step, first.occurrence) == (task_id, "a", "a#1")
    assert "handler 'raise.sync' failed: LookupError: no order A-1" in first.getMessage()
    assert first.exc_info is not None
    where = traceback.extract_tb(first.exc_info[2])[-1]  # raised in the handler's thread
    assert (where.filename, where.name) == (__file__, "raise_in_a_thread")
    assert where.line == 'raise LookupError(f"no order {order}")  # the line a user must find'
    # The stored error is as before: the name and message only.
    evidence = await store.tasks.evidence(task_id)
    assert [e["error"] for e in evidence] == [
        {"name": "LookupError", "message": "no order A-1"}
    ] * 2


# --- reconciliation ---------------------------------------------------------------------------


async def test_started_without_outcome_on_non_idempotent_effect_fails_closed(store: Store) -> None:
    """A takeover finds an intent with no outcome: reconciliation, and no second call."""
    (task_id,) = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0}])
    d = definition(FIVE_SLOW_STEPS)
    # Simulate a worker that wrote the intent of s2 and died during the call.
    from toolkit.engine import Interpreter

    class Crash(BaseException):
        pass

    crashing = App("crashing")

    @crashing.effect("count.work")
    async def work(ctx: Any, seconds: float = 0) -> dict[str, Any]:
        if ctx.step == "s2":
            raise Crash
        return {"ok": True}

    (task,) = await store.leases.claim("dead", [d.digest], 1, 30.0)
    with pytest.raises(Crash):
        await Interpreter(store, crashing, "dead").execute(task, d)
    async with store.db.connection() as conn:
        await conn.execute(
            "UPDATE toolkit_tasks SET lease_expires_at = now() - interval '1 second'"
        )
    report = await run_until_idle(store, FIVE_SLOW_STEPS)
    record = await store.tasks.get(task_id)
    assert report.recovered == 1 and report.waiting == 1
    assert record.state == "waiting" and record.wait_reason == "reconciliation"
    assert record.checkpoint["pending"] == "s2#1"
    assert await calls(store) == {}  # the real handler was never called for s2
    assert [e["kind"] for e in await store.tasks.events(task_id)][-1] == "reconciliation_required"


async def test_reconcile_completed_failed_and_retry(store: Store) -> None:
    completed, failed, retried, refused = await leave_uncertain(store, 4)
    with pytest.raises(NotReconcilable, match="not waiting for reconciliation of step 'done'"):
        await store.tasks.reconcile(refused, "done", "completed")
    await store.tasks.reconcile(completed, "charge", "completed", result={"value": "by hand"})
    await store.tasks.reconcile(failed, "charge", "failed", error="Declined")
    await store.tasks.reconcile(retried, "charge", "retry")
    with pytest.raises(NotReconcilable):  # no longer waiting
        await store.tasks.reconcile(completed, "charge", "completed")
    await drain(store, UNCERTAIN)

    assert (await store.tasks.get(completed)).result == {"value": "by hand"}
    # --failed goes through the retry policy: the uncertain call was attempt 1 of 2, so the
    # handler is called once more (before catch would see Declined).
    failed_task = await store.tasks.get(failed)
    assert failed_task.state == "succeeded" and failed_task.result["attempt"] == 2
    failed_records = [e["record"] for e in await store.tasks.evidence(failed)]
    assert failed_records == ["started", "failed", "started", "completed"]
    assert (await store.tasks.get(retried)).result["value"] == "charged"
    records = [(e["record"], e["worker_id"]) for e in await store.tasks.evidence(completed)]
    assert records == [("started", "dead"), ("completed", "operator")]
    retried_records = [e["record"] for e in await store.tasks.evidence(retried)]
    assert retried_records == ["started", "started", "completed"]
    kinds = [e["kind"] for e in await store.tasks.events(completed)]
    assert "reconciled" in kinds and kinds[-1] == "succeeded"


# --- sync handlers ----------------------------------------------------------------------------


async def test_sync_handlers_run_in_a_thread(store: Store) -> None:
    """Four sync handlers that each wait until all four run at once: they can meet only in
    threads of their own, with the event loop free to start the next (a handler run on the
    loop would block it, and its meeting would time out). No timing is asserted: a loaded
    machine delays the loop without making this fail."""
    text = """
name: sync
version: 1
input: {type: object}
start: a
steps:
  a: {effect: count.sync_meet, idempotent: true, args: {parties: 4}}
"""
    ids = await submit(store, text, [{}] * 4)
    report = await run_until_idle(store, text, concurrency=4)
    results = [(await store.tasks.get(task_id)).result for task_id in ids]
    assert report.succeeded == 4, (report, results)
    assert results == [{"step": "a", "thread": True}] * 4


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


async def test_a_submit_overrides_the_budget(store: Store) -> None:
    (task_id,) = await deploy_submit(store, SPEND, [{}], budget={"tokens": 500})
    await drain(store, SPEND)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded"
    assert task.checkpoint["budget"]["tokens"] == {"limit": 500, "spent": 120, "reserved": 0}
