"""The fencing audit (``toolkit.history.audit``) against real histories and hand-made corrupt ones.

Sound histories come from real runs: workflows drained by an in-process supervisor, a crash
and takeover by row surgery (lease backdated), a stale writer refused by the fence, a
reconciliation, a direct cancel, and a worker process killed with SIGKILL. Corrupt ones are
written row by row into the history tables, each statement on its own so database time
moves on between them, and must each yield exactly the expected violation.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.inprocess import deploy_submit, drain, expire_leases, make_due, sql
from tests.helpers.workflows import FIVE_SLOW_STEPS, THREE_STEPS, definition
from toolkit.application import App
from toolkit.engine import Interpreter
from toolkit.errors import LeaseLost, UnknownTask
from toolkit.history.audit import ViolationKind, audit_all, audit_task
from toolkit.store import Store
from toolkit.store.filters import TaskFilter
from toolkit.store.writes import Event, FencedWrite

pytestmark = pytest.mark.anyio

RETRIED_INTENT = """
name: retried-intent
version: 1
input: {type: object}
start: charge
steps:
  charge:
    effect: count.flaky
    idempotent: false
    args: {fail_times: 1}
    retry: {max_attempts: 2, initial: 10ms}
    next: done
  done: {succeed: {output: "${ steps.charge }"}}
"""

TIMER_AND_SIGNAL = """
name: timer-and-signal
version: 1
input: {type: object}
start: pause
steps:
  pause: {wait: {duration: 0.05s}, next: approve}
  approve: {wait: {signal: go}, next: ship}
  ship: {effect: count.work, idempotent: false, args: {value: "${ steps.approve }"}}
"""


async def crash_at(store: Store, text: str, step: str) -> int:
    """Claim the one queued task as worker ``dead`` and crash when ``step`` is called."""
    d = definition(text)

    class Crash(BaseException):
        pass

    crashing = App("crashing")
    for name in {"count.work", "count.flaky"}:

        @crashing.effect(name)
        async def handler(ctx: Any, **_: Any) -> dict[str, Any]:
            if ctx.step == step:
                raise Crash
            return {"ok": True}

    (task,) = await store.leases.claim("dead", [d.digest], 1, 30.0)
    with pytest.raises(Crash):
        await Interpreter(store, crashing, "dead").execute(task, d)
    await expire_leases(store)
    return task.id


# --- sound histories ------------------------------------------------------------------------


async def test_real_workflows_leave_sound_histories(store: Store) -> None:
    ids = await deploy_submit(store, THREE_STEPS, [{"n": 5}, {"n": 0}])
    ids += await deploy_submit(store, FIVE_SLOW_STEPS, [{"seconds": 0}] * 3)
    ids += await deploy_submit(store, RETRIED_INTENT, [{}])
    (signalled,) = await deploy_submit(store, TIMER_AND_SIGNAL, [{}])
    await store.tasks.signal(signalled, "go", {"ok": True})
    texts = (THREE_STEPS, FIVE_SLOW_STEPS, RETRIED_INTENT, TIMER_AND_SIGNAL)
    await drain(store, *texts)
    # Row surgery: the timer is due now; a worker that drains stops before a future timer.
    await sql(store, "UPDATE toolkit_tasks SET run_at = now() WHERE id = %s", signalled)
    await drain(store, *texts)
    ids.append(signalled)
    assert {(await store.tasks.get(i)).state for i in ids} == {"succeeded"}
    # A non-idempotent effect that failed with a known error is started again: that is sound.
    records = [e["record"] for e in await store.tasks.evidence(ids[5])]
    assert records == ["started", "failed", "started", "completed"]

    report = await audit_all(store)
    assert report.ok, report.violations
    assert report.tasks_checked == len(ids) and report.stale_token_commits == 0
    assert all(n == 0 for n in report.by_kind.values())
    for task_id in ids:
        assert await audit_task(store.db, task_id) == []


async def test_crash_and_takeover_by_row_surgery_leave_sound_histories(store: Store) -> None:
    # An idempotent step lost to a crash: the takeover calls it again under token 2.
    (idem,) = await deploy_submit(store, FIVE_SLOW_STEPS, [{"seconds": 0}])
    await crash_at(store, FIVE_SLOW_STEPS, "s3")
    await drain(store, FIVE_SLOW_STEPS)
    # A non-idempotent intent without outcome: fail closed, reconcile (retry), finish.
    (nonidem,) = await deploy_submit(store, FIVE_SLOW_STEPS, [{"seconds": 0}])
    await crash_at(store, FIVE_SLOW_STEPS, "s2")
    await drain(store, FIVE_SLOW_STEPS)
    assert (await store.tasks.get(nonidem)).wait_reason == "reconciliation"
    await store.tasks.reconcile(nonidem, "s2", "retry")
    await drain(store, FIVE_SLOW_STEPS)

    for task_id in (idem, nonidem):
        task = await store.tasks.get(task_id)
        assert task.state == "succeeded" and task.lease_token >= 2
    s2 = [e["record"] for e in await store.tasks.evidence(nonidem) if e["step"] == "s2"]
    assert s2 == ["started", "started", "completed"]  # the reconciliation lies between
    assert (await audit_all(store)).ok


async def test_a_stale_writer_refused_by_the_fence_leaves_a_sound_history(store: Store) -> None:
    (task_id,) = await deploy_submit(store, THREE_STEPS, [{"n": 1}])
    digest = definition(THREE_STEPS).digest
    (stale,) = await store.leases.claim("stale", [digest], 1, 30.0)
    await expire_leases(store)
    (fresh,) = await store.leases.claim("fresh", [digest], 1, 30.0)
    assert (stale.token, fresh.token) == (1, 2)
    late = FencedWrite(
        fence=stale.fence("stale"),
        checkpoint=stale.checkpoint,
        state="failed",
        error={"name": "Late", "message": "written after the lease moved on"},
        events=(Event("failed"),),
    )
    with pytest.raises(LeaseLost):
        await store.leases.commit(late)
    await expire_leases(store)
    await drain(store, THREE_STEPS)
    assert (await store.tasks.get(task_id)).state == "succeeded"
    assert await audit_task(store, task_id) == []


async def test_a_direct_cancel_ends_a_task_without_a_token(store: Store) -> None:
    queued, waiting = await deploy_submit(store, TIMER_AND_SIGNAL, [{}, {}])
    assert await store.tasks.cancel(queued) == "cancelled"
    await drain(store, TIMER_AND_SIGNAL)
    assert (await store.tasks.get(waiting)).state == "waiting"
    assert await store.tasks.cancel(waiting) == "cancelled"
    report = await audit_all(store)
    assert report.ok and report.tasks_checked == 2


async def test_a_bulk_cancel_ends_tasks_without_a_token_too(store: Store) -> None:
    """Regression (a helper's report): a bulk cancel's event names its operator, and the
    audit took that unfenced terminal event for a worker's (terminal_write)."""
    await deploy_submit(store, TIMER_AND_SIGNAL, [{}, {}])
    await drain(store, TIMER_AND_SIGNAL)
    plan = await store.bulk.plan_cancel(TaskFilter(definition="timer-and-signal"), operator="ana")
    applied = await store.bulk.apply(plan.id)
    assert applied.applied == 2, applied
    report = await audit_all(store)
    assert report.ok and report.tasks_checked == 2, report.violations


# --- hand-made corrupt histories ------------------------------------------------------------


class Forge:
    """Writes a task's history row by row (each row its own statement, so its own time)."""

    def __init__(self, store: Store, task_id: int) -> None:
        self.store = store
        self.task_id = task_id

    async def event(
        self, kind: str, token: int | None, worker: str | None = "w1", **detail: Any
    ) -> str:
        rows = await sql(
            self.store,
            "INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, "
            "detail) SELECT %s, tenant, %s, %s, %s, %s::jsonb FROM toolkit_tasks "
            "WHERE id = %s RETURNING id",
            self.task_id, kind, worker, token, _json(detail), self.task_id,
        )  # fmt: skip
        return f"event {rows[0][0]}"

    async def evidence(
        self, occurrence: str, record: str, token: int, worker: str = "w1", *, idempotent: bool
    ) -> str:
        step = occurrence.split("#")[0]
        rows = await sql(
            self.store,
            "INSERT INTO toolkit_effect_evidence (task_id, tenant, occurrence, step, handler, "
            "idempotent, idempotency_key, record, attempt, fencing_token, worker_id) "
            "SELECT %s, tenant, %s, %s, 'count.work', %s, %s, %s, 1, %s, %s "
            "FROM toolkit_tasks WHERE id = %s RETURNING id",
            self.task_id, occurrence, step, idempotent, f"{self.task_id}:{occurrence}", record,
            token, worker, self.task_id,
        )  # fmt: skip
        return f"evidence {rows[0][0]}"

    async def row(self, state: str, token: int) -> None:
        await sql(
            self.store,
            "UPDATE toolkit_tasks SET state = %s, lease_token = %s WHERE id = %s",
            state, token, self.task_id,
        )  # fmt: skip


def _json(detail: dict[str, Any]) -> str | None:
    import json

    return json.dumps(detail) if detail else None


@pytest.fixture
async def forge(store: Store) -> Forge:
    (task_id,) = await deploy_submit(store, THREE_STEPS, [{"n": 1}])
    return Forge(store, task_id)


async def found(forge: Forge) -> list[tuple[ViolationKind, str | None]]:
    return [(v.kind, v.record) for v in await audit_task(forge.store, forge.task_id)]


async def test_evidence_under_an_old_token_after_a_newer_claim(forge: Forge) -> None:
    await forge.event("claimed", 1)
    await forge.evidence("first#1", "completed", 1, idempotent=True)
    await forge.event("recovered", 2, "w2")
    stale = await forge.evidence("first#1", "completed", 1, idempotent=True)
    await forge.row("queued", 2)
    assert await found(forge) == [(ViolationKind.STALE_TOKEN_COMMIT, stale)]


async def test_event_under_an_old_token_after_a_newer_claim(forge: Forge) -> None:
    await forge.event("claimed", 1)
    await forge.event("recovered", 2, "w2")
    stale = await forge.event("retry_scheduled", 1)
    await forge.row("queued", 2)
    assert await found(forge) == [(ViolationKind.STALE_TOKEN_COMMIT, stale)]


async def test_a_token_never_issued(forge: Forge) -> None:
    await forge.event("claimed", 1)
    forged = await forge.event("waiting", 5)
    await forge.row("queued", 1)
    assert await found(forge) == [(ViolationKind.UNISSUED_TOKEN, forged)]


async def test_a_double_started_non_idempotent_effect(forge: Forge) -> None:
    await forge.event("claimed", 1)
    await forge.evidence("second#1", "started", 1, idempotent=False)
    await forge.event("recovered", 2, "w2")
    again = await forge.evidence("second#1", "started", 2, "w2", idempotent=False)
    await forge.row("queued", 2)
    assert await found(forge) == [(ViolationKind.DOUBLE_START, again)]


@pytest.mark.parametrize("answer", ["failed", "operator", "reconciled"])
async def test_a_second_start_after_an_answer_is_sound(forge: Forge, answer: str) -> None:
    await forge.event("claimed", 1)
    await forge.evidence("second#1", "started", 1, idempotent=False)
    if answer == "failed":
        await forge.evidence("second#1", "failed", 1, idempotent=False)
    elif answer == "operator":
        await forge.evidence("second#1", "failed", 1, "alice", idempotent=False)
    else:
        await forge.event("reconciled", None, "alice", occurrence="second#1", outcome="retry")
    await forge.event("claimed", 2, "w2")
    await forge.evidence("second#1", "started", 2, "w2", idempotent=False)
    await forge.row("queued", 2)
    assert await found(forge) == []


async def test_an_idempotent_effect_may_start_twice(forge: Forge) -> None:
    await forge.event("claimed", 1)
    await forge.evidence("first#1", "started", 1, idempotent=True)
    await forge.event("recovered", 2, "w2")
    await forge.evidence("first#1", "started", 2, "w2", idempotent=True)
    await forge.row("queued", 2)
    assert await found(forge) == []


async def test_decreasing_tokens(forge: Forge) -> None:
    await forge.event("claimed", 1)
    await forge.event("recovered", 2, "w2")
    back = await forge.event("recovered", 1, "w3")
    await forge.row("queued", 2)
    assert await found(forge) == [(ViolationKind.TOKEN_NOT_INCREASING, back)]


async def test_a_skipped_token(forge: Forge) -> None:
    await forge.event("claimed", 1)
    jump = await forge.event("recovered", 3, "w2")
    await forge.row("queued", 3)
    assert await found(forge) == [(ViolationKind.TOKEN_SKIPPED, jump)]


async def test_a_terminal_event_under_an_old_token(forge: Forge) -> None:
    await forge.event("claimed", 1)
    final = await forge.event("succeeded", 1)
    await forge.event("recovered", 2, "w2")  # a later claim: token 1 is no longer the last
    await forge.row("succeeded", 2)
    assert await found(forge) == [(ViolationKind.TERMINAL_WRITE, final)]


async def test_a_stale_terminal_event_is_reported_once(forge: Forge) -> None:
    await forge.event("claimed", 1)
    await forge.event("recovered", 2, "w2")
    final = await forge.event("succeeded", 1)
    await forge.row("succeeded", 2)
    assert await found(forge) == [(ViolationKind.STALE_TOKEN_COMMIT, final)]


async def test_a_worker_terminal_event_without_a_token(forge: Forge) -> None:
    await forge.event("claimed", 1)
    final = await forge.event("succeeded", None)
    await forge.row("succeeded", 1)
    assert await found(forge) == [(ViolationKind.TERMINAL_WRITE, final)]


# a row moved to another tenant by hand: a distributed table keeps its rows' tenant
@pytest.mark.one_postgresql
async def test_a_record_under_another_tenant(forge: Forge) -> None:
    """Migration 0026: every event and evidence row carries its task's tenant."""
    await forge.event("claimed", 1)
    moved = await forge.evidence("first#1", "completed", 1, idempotent=True)
    await sql(
        forge.store,
        "UPDATE toolkit_effect_evidence SET tenant = 'elsewhere' WHERE id = %s",
        int(moved.split()[1]),
    )
    await forge.row("queued", 1)
    assert await found(forge) == [(ViolationKind.TENANT_MISMATCH, moved)]
    await sql(forge.store, "DELETE FROM toolkit_effect_evidence WHERE tenant = 'elsewhere'")


async def test_audit_all_counts_by_kind(store: Store) -> None:
    clean, stale, double = await deploy_submit(store, THREE_STEPS, [{"n": 1}] * 3)
    await drain(store, THREE_STEPS)
    for task_id in (stale, double):
        await sql(store, "UPDATE toolkit_tasks SET state = 'queued' WHERE id = %s", task_id)
    await make_due(store, stale, double)  # the rotation is told: a cluster has no trigger
    await Forge(store, stale).event("waiting", 0)
    await Forge(store, double).evidence("second#1", "started", 1, idempotent=False)

    report = await audit_all(store, page_size=2)
    assert report.tasks_checked == 3 and report.stale_token_commits == 1
    assert report.by_kind[ViolationKind.DOUBLE_START] == 1
    assert sum(report.by_kind.values()) == 2 and not report.ok
    assert {v.task_id for v in report.violations} == {stale, double}
    assert "3 tasks checked, 2 violations" in report.summary()

    subset = await audit_all(store.db, task_ids=[clean, double, 10**9])
    assert subset.tasks_checked == 2 and subset.unknown_tasks == (10**9,)
    assert [v.kind for v in subset.violations] == [ViolationKind.DOUBLE_START]
    with pytest.raises(UnknownTask):
        await audit_task(store, 10**9)
    with pytest.raises(ValueError, match="page_size"):
        await audit_all(store, page_size=0)
