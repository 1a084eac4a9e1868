"""The interpreter and supervisor in-process, against a real PostgreSQL."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.apps.counting import app
from tests.inprocess import drain
from tests.processes import eventually
from tests.workflows import FIVE_SLOW_STEPS, THREE_STEPS, definition
from toolkit.application import App
from toolkit.errors import ConfigError, MissingHandlers, WorkerIdInUse
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio

FAST = dict(lease=6.0, heartbeat=0.5, idle_backoff_min=0.01, idle_backoff_max=0.1)


async def run_until_idle(store: Store, *texts: str, **config: Any):
    definitions = [definition(t) for t in texts]
    worker = Worker(store, app, definitions)
    return await WorkflowSupervisor(
        worker, SupervisorConfig(until_idle=True, **{**FAST, **config})
    ).run()


async def submit(store: Store, text: str, inputs: list[Any]) -> list[int]:
    d = definition(text)
    await store.definitions.deploy(d)
    return await store.tasks.submit(d, inputs)


async def calls(store: Store) -> dict[str, int]:
    async with store.db.connection() as conn:
        exists = await (
            await conn.execute("SELECT to_regclass('test_calls') IS NOT NULL")
        ).fetchone()
        if not exists or not exists[0]:
            return {}
        rows = await (
            await conn.execute("SELECT idempotency_key, calls FROM test_calls")
        ).fetchall()
    return dict(rows)


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
    retry: {max_attempts: 3, initial: 0.01, factor: 2, max: 0.05, non_retryable: [Fatal]}
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
            "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() - interval '1 second'"
        )
    report = await run_until_idle(store, FIVE_SLOW_STEPS)
    record = await store.tasks.get(task_id)
    assert report.recovered == 1 and report.waiting == 1
    assert record.state == "waiting" and record.wait_reason == "reconciliation"
    assert record.checkpoint["pending"] == "s2#1"
    assert await calls(store) == {}  # the real handler was never called for s2
    assert [e["kind"] for e in await store.tasks.events(task_id)][-1] == "reconciliation_required"


async def test_shutdown_waits_for_started_cycles_then_releases(store: Store) -> None:
    ids = await submit(store, FIVE_SLOW_STEPS, [{"seconds": 0.3}] * 2)
    worker = Worker(store, app, [definition(FIVE_SLOW_STEPS)])
    shutdown = CancellationToken()
    config = SupervisorConfig(concurrency=2, grace=0.2, **FAST)

    async def stop_when_running() -> None:
        async def running() -> bool:
            return bool(await calls(store))

        await eventually(running, what="a handler running")
        shutdown.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_when_running)
        report = await WorkflowSupervisor(worker, config).run(shutdown)
    assert report.released == 2
    for task_id in ids:
        task = await store.tasks.get(task_id)
        assert task.state == "queued" and task.lease_owner is None
    # Nothing lost: another worker finishes them, and completed steps are not re-run.
    before = await calls(store)
    await run_until_idle(store, FIVE_SLOW_STEPS, concurrency=2)
    assert [(await store.tasks.get(i)).state for i in ids] == ["succeeded", "succeeded"]
    after = await calls(store)
    assert all(after[key] <= count + 1 for key, count in before.items())


async def test_sync_handlers_run_in_a_thread(store: Store) -> None:
    text = """
name: sync
version: 1
input: {type: object}
start: a
steps:
  a: {effect: count.sync_work, idempotent: true, args: {seconds: 0.2}}
"""
    ids = await submit(store, text, [{}] * 4)
    report = await run_until_idle(store, text, concurrency=4)
    assert report.succeeded == 4
    assert report.max_loop_lag < 0.15  # four 0.2 s sleeps did not block the loop
    assert (await store.tasks.get(ids[0])).result == {"step": "a", "thread": True}


async def test_worker_refuses_missing_handlers_and_bad_config(store: Store) -> None:
    with pytest.raises(MissingHandlers, match=r"\$\.steps\.first\.effect: no handler 'count.work'"):
        Worker(store, App("empty"), [definition(THREE_STEPS)])
    with pytest.raises(ConfigError, match="at most a third of the lease"):
        SupervisorConfig(lease=3, heartbeat=2)


UNFIT = """
name: unfit
version: 1
start: a
steps:
  a: {effect: fit.one, idempotent: true, args: {y: 1}, next: b}
  b: {effect: fit.one, idempotent: true, next: c}
  c: {effect: fit.one, idempotent: true, args: {x: "${ input.x }"}, next: d}
  d: {effect: fit.any, idempotent: true, args: {y: 1, z: 2}, next: e}
  e: {effect: fit.one, idempotent: true, args: "${ input }"}
"""


async def test_worker_refuses_handlers_whose_signature_cannot_take_the_args(
    store: Store,
) -> None:
    """Keys of ``args`` known before it renders are checked against the signature at start;
    an ``args`` expression is checked at the call: the step fails at once, no retry."""
    fit = App("fit")

    @fit.effect("fit.one")
    async def one(ctx: Any, x: int) -> int:
        return x

    @fit.effect("fit.any")
    async def any_args(ctx: Any, **kwargs: Any) -> int:
        return len(kwargs)

    @fit.effect("fit.inner")
    def inner(ctx: Any) -> None:
        raise TypeError("a fault of the handler's own")

    with pytest.raises(MissingHandlers) as caught:
        Worker(store, fit, [definition(UNFIT)])
    assert str(caught.value).splitlines() == [
        "<test>: $.steps.a.args: handler 'fit.one' cannot take these arguments: it has no"
        " parameter 'y'; it needs 'x'",
        "<test>: $.steps.b.args: handler 'fit.one' cannot take these arguments: it needs 'x'",
    ]
    late = UNFIT.replace("args: {y: 1}, next: b", "args: {x: 1}, next: b").replace(
        "idempotent: true, next: c", "idempotent: true, args: {x: 2}, next: c"
    )
    (task_id,) = await submit(store, late, [{"x": 3, "w": 4}])
    report = await drain(store, late, handlers=fit)
    task = await store.tasks.get(task_id)
    assert report.failed == 1 and task.error["name"] == "HandlerArgumentsMismatch", task.error
    assert task.error["message"] == "handler 'fit.one': it has no parameter 'w'"
    assert task.error["attempts"] == 1  # never retried
    # A TypeError the handler raises itself is its own error: retried as any other.
    inner_text = """
name: inner
version: 1
start: a
steps:
  a: {effect: fit.inner, idempotent: true, retry: {max_attempts: 2, initial: 10ms}}
"""
    (task_id,) = await submit(store, inner_text, [{}])
    await drain(store, inner_text, handlers=fit)
    error = (await store.tasks.get(task_id)).error
    assert (error["name"], error["attempts"]) == ("TypeError", 2), error


async def test_second_live_worker_with_same_id_is_refused(store: Store) -> None:
    d = definition(THREE_STEPS)
    first = Worker(store, app, [d], worker_id="same")
    await first.register(1, 30.0)
    with pytest.raises(WorkerIdInUse):
        await Worker(store, app, [d], worker_id="same").register(1, 30.0)
    await first.unregister()
    await Worker(store, app, [d], worker_id="same").register(1, 30.0)


async def test_a_worker_that_takes_over_its_own_task_keeps_the_new_lease_alive(
    store: Store,
) -> None:
    """Regression: the stale cycle's end removed the new cycle's lease from the heartbeat."""
    text = """
name: own-takeover
version: 1
input: {type: object}
start: slow
steps:
  slow: {effect: own.slow, idempotent: true}
"""
    (task_id,) = await submit(store, text, [{}])
    own = App("own")
    calls_seen: list[int] = []

    @own.effect("own.slow")
    async def slow(ctx: Any) -> dict[str, Any]:
        calls_seen.append(ctx.fencing_token)
        await anyio.sleep(1.0 if len(calls_seen) == 1 else 4.0)
        return {"token": ctx.fencing_token}

    worker = Worker(store, own, [definition(text)])
    config = SupervisorConfig(
        lease=2.0, heartbeat=0.5, idle_backoff_min=0.01, idle_backoff_max=0.05, until_idle=True
    )

    async def expire_the_first_lease() -> None:
        async def called() -> bool:
            return bool(calls_seen)

        await eventually(called, what="the first call")
        async with store.db.connection() as conn:
            await conn.execute(
                "UPDATE toolkit_tasks SET lease_expires_at = clock_timestamp() - interval '1s'"
                " WHERE id = %s",
                (task_id,),
            )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(expire_the_first_lease)
            await WorkflowSupervisor(worker, config).run()
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded" and task.result == {"token": 2}
    assert calls_seen == [1, 2]  # the new lease lived through the 4 s call: no third claim
