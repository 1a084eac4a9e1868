"""The fence, written once: ``toolkit_lease_held`` guards every state-changing statement.

DESIGN §2: every state-changing write carries its lease's fence and applies only while that
lease is held and unexpired, in the same statement. The guard is one SQL function
(migration 0007); these tests check that each statement that changes a task under a lease
calls it, that the check finds a statement that does not, that each of the guard's terms
refuses on its own, and that the planner inlines it (the plans are those of the terms
written out).
"""

from __future__ import annotations

import re

import pytest

from tests.helpers.inprocess import deploy_submit, sql
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.store import Store
from toolkit.store.queries import query, query_names

pytestmark = pytest.mark.anyio

GUARD = "toolkit_lease_held("

#: Statements that change tasks without a lease of their own, and why that is right.
UNFENCED = {
    "submit_tasks": "creates tasks: there is no lease yet",
    "submit_keyed_task": "creates a task: there is no lease yet",
    "submit_debounced_task": "creates a task, or gives a new input to one that waits for its"
    " debounce (never claimed yet: there is no lease)",
    "claim_tasks": "takes the lease (and raises the token) of tasks nobody holds",
    "claim_tasks_one_tenant": "takes the lease of tasks nobody holds (one tenant alone)",
    "claim_tenant_tasks": "takes the lease of tasks nobody holds (one tenant's, on a store"
    " distributed by tenant)",
    "record_event": "an event of tasks a claim took or of a write commit_fenced_on_shard"
    " applied, in its transaction (their rows stay locked by it until the commit)",
    "record_evidence": "evidence of a write commit_fenced_on_shard applied, in its"
    " transaction (the task's row stays locked by it until the commit)",
    "record_cancel_found": "the cancelled event of a write commit_fenced_on_shard applied,"
    " in its transaction",
    "wake_raced_waits": "a wake-up, in the transaction of the fenced write of its wait",
    "wake_waiting_branches": "a wake-up, in the transaction of the fenced write of its wait",
    "make_branch_waiters_due": "wake_waiting_branches' last statement on a store distributed"
    " by tenant, in the same transaction",
    "wake_branches": "a sender's wake-up of waiting branches: run_at of waiting tasks only",
    "wake_parent_branches": "a child's end wakes its parent's waiting branch: run_at only",
    "send_signal": "a sender's wake-up: it moves run_at of a waiting task only",
    "deliver_event": "an event's delivery: as send_signal, it moves run_at of waiting tasks",
    "complete_callback": "a completion's wake-up: it moves run_at of a waiting task only",
    "request_cancel": "an operator's cancel: it ends tasks nobody holds, asks holders",
    "cancel_tasks": "request_cancel for the live descendants of a cancelled task",
    "reconcile_effect": "an operator's record of an outcome, for a task nobody holds",
    "prune_tasks": "retention deletes ended tasks only",
    "wake_limit_waiters": "an operator's change of a limit wakes the tasks waiting for it:"
    " run_at of waiting tasks only",
    "admit_tenant_key": "admits tasks waiting for their concurrency key (nobody holds them)",
    "await_task": "marks a task awaited (a column no fenced write reads)",
    "fire_schedule": "creates tasks (no lease yet), fenced by a compare-and-set on its schedule",
    "bulk_cancel": "an operator's cancel of tasks whose token and state the plan recorded",
    "bulk_signal": "an operator's signals: it moves run_at of waiting tasks only",
    "bulk_reconcile": "an operator's record of outcomes, for tasks nobody holds",
    "redrive_task": "an operator's redrive of an ended task (compare-and-set on its state and"
    " token, which it raises as a claim does)",
}

_CHANGES_TASKS = re.compile(
    r"\b(UPDATE\s+toolkit_tasks|INSERT\s+INTO\s+toolkit_tasks|DELETE\s+FROM\s+toolkit_tasks"
    r"|INSERT\s+INTO\s+toolkit_effect_evidence)\b",
    re.IGNORECASE,
)


def unguarded(statements: dict[str, str]) -> list[str]:
    """The statements that should apply the fence and do not.

    A statement should when it changes a task row or appends effect evidence, or when it
    acts for a lease holder (it takes both ``worker_id`` and ``token``), unless it is one of
    the :data:`UNFENCED` kinds of write.
    """
    missing = []
    for name, text in statements.items():
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        acts_for_holder = "%(worker_id)s" in code and "%(token)s" in code
        if (_CHANGES_TASKS.search(code) or acts_for_holder) and name not in UNFENCED:
            if GUARD not in code:
                missing.append(name)
    return missing


def statements() -> dict[str, str]:
    return {name: query(name) for name in query_names()}


def test_every_statement_that_changes_a_leased_task_applies_the_fence() -> None:
    assert unguarded(statements()) == []


def test_the_list_of_unfenced_statements_names_real_unguarded_ones() -> None:
    known = statements()
    assert set(UNFENCED) <= set(known), set(UNFENCED) - set(known)
    for name in UNFENCED:
        code = "\n".join(line.split("--", 1)[0] for line in known[name].splitlines())
        assert GUARD not in code, name


def test_the_check_finds_a_statement_without_the_fence() -> None:
    """Not vacuous: take the guard out of a fenced statement, and the check names it."""
    known = statements()
    assert unguarded(known) == []
    for name in ("commit_fenced", "renew_leases", "write_reservation", "create_callback"):
        stripped = known[name].replace(GUARD, "coalesce(")
        assert unguarded({**known, name: stripped}) == [name]
    acting = "UPDATE toolkit_limit_slots SET token = %(token)s WHERE owner = %(worker_id)s"
    assert unguarded({**known, "acts_for_a_holder": acting}) == ["acts_for_a_holder"]


async def _leased(store: Store) -> tuple[int, str, int]:
    (task_id,) = await deploy_submit(store, THREE_STEPS, [{"n": 1}], tenant="acme")
    (task,) = await store.leases.claim("w", [definition(THREE_STEPS).digest], 1, 30.0)
    return task_id, task.tenant, task.token


async def _held(store: Store, task_id: int, worker: str, tenant: str, token: int) -> bool:
    ((held,),) = await sql(
        store,
        "SELECT toolkit_lease_held(t, %s, %s, %s) FROM toolkit_tasks t WHERE t.id = %s",
        worker, tenant, token, task_id,
    )  # fmt: skip
    return bool(held)


async def test_each_term_of_the_fence_refuses_on_its_own(store: Store) -> None:
    task_id, tenant, token = await _leased(store)
    assert await _held(store, task_id, "w", tenant, token)
    assert not await _held(store, task_id, "another worker", tenant, token)
    assert not await _held(store, task_id, "w", "another tenant", token)
    assert not await _held(store, task_id, "w", tenant, token + 1)
    await sql(store, "UPDATE toolkit_tasks SET lease_expires_at = now() WHERE id = %s",
              task_id)  # fmt: skip
    assert not await _held(store, task_id, "w", tenant, token)  # expired
    # Not leased (a row of another state cannot keep its lease columns: try the term on a
    # copy of the row that differs in its state alone).
    ((held,),) = await sql(
        store,
        "SELECT toolkit_lease_held(jsonb_populate_record(t, '{\"state\": \"waiting\","
        " \"lease_expires_at\": \"9999-01-01T00:00:00+00:00\"}'), %s, %s, %s)"
        " FROM toolkit_tasks t WHERE t.id = %s",
        "w", tenant, token, task_id,
    )  # fmt: skip
    assert held is False


async def test_the_planner_inlines_the_fence(store: Store) -> None:
    """The guard's terms appear in the plan as column conditions: no function call is left
    (a call would hide them from the planner and cost a call per row)."""
    task_id, tenant, token = await _leased(store)
    rows = await sql(
        store,
        "EXPLAIN (VERBOSE) UPDATE toolkit_tasks t SET updated_at = statement_timestamp()"
        " WHERE t.id = %s AND toolkit_lease_held(t, %s, %s, %s)",
        task_id, "w", tenant, token,
    )  # fmt: skip
    plan = "\n".join(row[0] for row in rows)
    assert "toolkit_lease_held" not in plan, plan
    for term in ("lease_owner", "tenant", "lease_token", "state", "lease_expires_at"):
        assert term in plan, (term, plan)
