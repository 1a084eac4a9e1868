"""Durable semantics in-process: timers, signals, catch, reconciliation, cancellation."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.apps.counting import app
from tests.inprocess import FAST, deploy_submit, drain, due_in, make_due, sql
from tests.processes import eventually
from tests.workflows import definition
from toolkit.application import App
from toolkit.engine import Interpreter
from toolkit.errors import NotReconcilable, TaskTerminal, UnknownTask
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio











TIMER = """
name: timer
version: 1
input: {type: object}
start: pause
steps:
  pause: {wait: {duration: 1h}, next: after}
  after: {effect: count.work, idempotent: false, args: {value: done}}
"""


async def test_timer_releases_the_lease_and_fires_once_at_its_time(store: Store) -> None:
    (task_id,) = await deploy_submit(store, TIMER, [{}])
    report = await drain(store, TIMER)
    task = await store.tasks.get(task_id)
    assert report.waiting == 1
    assert (task.state, task.wait_reason, task.lease_owner) == ("waiting", "timer", None)
    assert 3500 < await due_in(store, task_id) <= 3600  # an hour from now, in database time
    assert await drain(store, TIMER) and (await store.tasks.get(task_id)).state == "waiting"
    await make_due(store, task_id)
    report = await drain(store, TIMER)
    task = await store.tasks.get(task_id)
    assert report.succeeded == 1 and task.state == "succeeded"
    assert task.result["value"] == "done"
    assert [e["record"] for e in await store.tasks.evidence(task_id)] == ["started", "completed"]


UNTIL = """
name: until
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {until: "${ input.at }"}}
"""


async def test_wait_until_uses_the_given_timestamp(store: Store) -> None:
    past, future, bad = await deploy_submit(
        store,
        UNTIL,
        [{"at": "2001-01-01T00:00:00Z"}, {"at": "2999-01-01T00:00:00+02:00"}, {"at": "soon"}],
    )
    await drain(store, UNTIL)
    assert (await store.tasks.get(past)).state == "succeeded"  # already due: fired at once
    waiting = await store.tasks.get(future)
    assert waiting.state == "waiting" and waiting.run_at.year == 2998
    failed = await store.tasks.get(bad)
    assert failed.state == "failed" and "ISO-8601" in failed.error["message"]


SIGNALLED = """
name: signalled
version: 1
input: {type: object}
start: first
steps:
  first:
    wait: {signal: go, timeout: 1h}
    next: second
    catch: [{errors: [Timeout], next: timed_out}]
  second: {wait: {signal: go}, next: done}
  done: {succeed: {output: ["${ steps.first }", "${ steps.second }"]}}
  timed_out: {succeed: {output: "${ steps.first.error.name }"}}
"""


async def test_signals_are_kept_consumed_once_in_order_and_wake_the_task(store: Store) -> None:
    early, late, never = await deploy_submit(store, SIGNALLED, [{}, {}, {}])
    # Sent before the task reaches the wait: kept, consumed then, in order.
    await store.tasks.signal(early, "go", {"n": 1})
    await store.tasks.signal(early, "go", {"n": 2})
    await store.tasks.signal(early, "go", {"n": 3})
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(early)).result == [{"n": 1}, {"n": 2}]
    consumed = [(s["payload"]["n"], s["consumed_by"]) for s in await store.tasks.signals(early)]
    assert consumed == [(1, "first#1"), (2, "second#1"), (3, None)]

    # Sent while the task waits: it becomes due at once.
    late_task = await store.tasks.get(late)
    assert late_task.state == "waiting" and late_task.wait_reason == "signal"
    await store.tasks.signal(late, "go", "a")
    await store.tasks.signal(late, "other", "ignored")
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(late)).state == "waiting"  # now on the second wait
    await store.tasks.signal(late, "go", "b")
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(late)).result == ["a", "b"]

    # The timeout routes to catch, with the error as data.
    await make_due(store, never)
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(never)).result == "Timeout"

    with pytest.raises(TaskTerminal):
        await store.tasks.signal(early, "go")
    with pytest.raises(UnknownTask):
        await store.tasks.signal(10**9, "go")


async def test_a_signal_racing_the_wait_commit_is_not_lost(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal stored while the task still holds its lease wakes it right after it waits."""
    (task_id,) = await deploy_submit(store, SIGNALLED, [{}])
    d = definition(SIGNALLED)
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)

    class Racing(type(store.leases)):  # type: ignore[misc]
        async def next_signal(self, task_id: int, names: Any, taken: Any = ()) -> Any:
            found = await super().next_signal(task_id, names, taken)
            await store.tasks.signal(task_id, names[0], "raced")  # arrives after the look
            return found

    monkeypatch.setattr(store, "leases", Racing(store.db))
    await Interpreter(store, app, "w").execute(task, d)
    record = await store.tasks.get(task_id)
    assert record.state == "waiting"
    due = await sql(
        store, "SELECT run_at <= clock_timestamp() FROM toolkit_tasks WHERE id = %s", task_id
    )
    assert due[0][0]  # woken at once, not at the timeout an hour away


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
    retry: {max_attempts: 2, initial: 0.01}
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


UNCERTAIN = """
name: uncertain
version: 1
input: {type: object}
start: charge
steps:
  charge:
    effect: count.work
    idempotent: false
    args: {value: charged}
    retry: {max_attempts: 2, initial: 0.01}
    catch: [{errors: [Declined], next: declined}]
    next: done
  done: {succeed: {output: "${ steps.charge }"}}
  declined: {succeed: {output: declined}}
"""


async def _leave_uncertain(store: Store, count: int) -> list[int]:
    """Tasks whose non-idempotent call crashed after its intent: waiting for reconciliation."""
    ids = await deploy_submit(store, UNCERTAIN, [{}] * count)
    d = definition(UNCERTAIN)
    crashing = App("crashing")

    class Crash(BaseException):
        pass

    @crashing.effect("count.work")
    async def work(ctx: Any, value: Any = None) -> None:
        raise Crash

    for task in await store.leases.claim("dead", [d.digest], count, 30.0):
        with pytest.raises(Crash):
            await Interpreter(store, crashing, "dead").execute(task, d)
    await sql(
        store, "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() - interval '1s'"
    )
    await drain(store, UNCERTAIN)
    for task_id in ids:
        task = await store.tasks.get(task_id)
        assert (task.state, task.wait_reason) == ("waiting", "reconciliation")
    return ids


async def test_reconcile_completed_failed_and_retry(store: Store) -> None:
    completed, failed, retried, refused = await _leave_uncertain(store, 4)
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


async def test_cancel_queued_waiting_and_terminal(store: Store) -> None:
    queued, waiting = await deploy_submit(store, TIMER, [{}, {}])
    await store.leases.claim("w", [definition(TIMER).digest], 0, 30.0)
    assert await store.tasks.cancel(queued, "no longer needed") == "cancelled"
    await drain(store, TIMER)
    assert (await store.tasks.get(waiting)).state == "waiting"
    assert await store.tasks.cancel(waiting) == "cancelled"
    task = await store.tasks.get(queued)
    assert task.state == "cancelled" and task.error["message"] == "no longer needed"
    with pytest.raises(TaskTerminal, match="cannot be cancelled"):
        await store.tasks.cancel(queued)
    with pytest.raises(UnknownTask):
        await store.tasks.cancel(10**9)


SLOW = """
name: slow
version: 1
input: {type: object}
start: quick
steps:
  quick: {effect: count.work, idempotent: true, args: {value: kept}, next: slow}
  slow: {effect: count.work, idempotent: true, args: {seconds: 30}}
"""


async def test_cancel_of_a_leased_task_reaches_its_handler_at_the_next_heartbeat(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, SLOW, [{}])
    worker = Worker(store, app, [definition(SLOW)])
    shutdown = CancellationToken()

    async def cancel_when_slow_runs() -> None:
        async def slow_runs() -> bool:
            return len(await sql(store, "SELECT 1 FROM test_calls")) >= 2

        async def not_leased() -> bool:
            return (await store.tasks.get(task_id)).state != "leased"

        await eventually(slow_runs, what="the slow step")
        assert await store.tasks.cancel(task_id, "operator said so") == "requested"
        await eventually(not_leased, what="the cancel")
        shutdown.cancel()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_when_slow_runs)
            report = await WorkflowSupervisor(worker, SupervisorConfig(**FAST)).run(shutdown)
    task = await store.tasks.get(task_id)
    assert report.cancelled == 1
    assert task.state == "cancelled" and task.error["message"] == "operator said so"
    assert task.checkpoint["outputs"]["quick"]["value"] == "kept"  # completed steps stay done
    assert [e["kind"] for e in await store.tasks.events(task_id)][-2:] == [
        "cancel_requested",
        "cancelled",
    ]


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
  b: {effect: count.work, idempotent: true, retry: {max_attempts: 2, initial: 0.01}}
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
        store, "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() - interval '1s'"
    )
    await drain(store, text)
    task_record = await store.tasks.get(task_id)
    assert task_record.state == "succeeded", task_record.error
