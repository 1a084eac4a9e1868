"""Running workflows in the test's own process: deploy, submit, drain with a supervisor.

The helpers every in-process store and worker test shares (process-level tests use
``tests.helpers.processes``).
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from tests.apps.counting import app
from tests.apps.counting import app as counting_app
from tests.helpers.workflows import UNCERTAIN, definition
from toolkit.application import App
from toolkit.cli import cli
from toolkit.engine import Interpreter
from toolkit.history.task_detail import TaskDetail
from toolkit.runtime.supervisor import SupervisorConfig, SupervisorReport, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

#: A worker configuration for tests: short lease and heartbeat, next to no idle backoff.
FAST: dict[str, Any] = dict(lease=6.0, heartbeat=0.5, idle_backoff_min=0.01, idle_backoff_max=0.05)


async def deploy_submit(store: Store, text: str, inputs: list[Any], **submit: Any) -> list[int]:
    """Deploy the definition ``text`` and submit one task per input; return the task ids."""
    d = definition(text)
    await store.definitions.deploy(d)
    return await store.tasks.submit(d, inputs, **submit)


async def drain(
    store: Store, *texts: str, handlers: App = counting_app, **config: Any
) -> SupervisorReport:
    """Run a worker of these definitions until nothing is left to do now; its report."""
    worker = Worker(store, handlers, [definition(text) for text in texts])
    return await WorkflowSupervisor(
        worker, SupervisorConfig(until_idle=True, **{**FAST, **config})
    ).run()


async def sql(store: Store, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run a statement on a pooled connection; its rows (none for a statement without)."""
    async with store.db.connection() as conn:
        cursor = await conn.execute(statement, params)  # type: ignore[arg-type]
        return await cursor.fetchall() if cursor.description else []


async def make_due(store: Store, *task_ids: int) -> None:
    """Row surgery: the tasks' timers or deadlines are reached now (no sleeping), and their
    tenants' rotation is told (:func:`mark_due`)."""
    await mark_due(store, await sql(
        store, "UPDATE toolkit_tasks SET run_at = now() WHERE id = ANY(%s) RETURNING tenant",
        list(task_ids),
    ))  # fmt: skip


async def expire_leases(store: Store, *task_ids: int) -> None:
    """Row surgery: the leases of the tasks (of every leased task when none is given) expired a
    second ago (no sleeping), and their tenants' rotation is told (:func:`mark_due`)."""
    await mark_due(store, await sql(
        store,
        "UPDATE toolkit_tasks SET lease_expires_at = now() - interval '1 second'"
        " WHERE state = 'leased' AND (cardinality(%s::bigint[]) = 0 OR id = ANY(%s))"
        " RETURNING tenant",
        list(task_ids), list(task_ids),
    ))  # fmt: skip


async def mark_due(store: Store, tenants: list[tuple[Any, ...]]) -> None:
    """Tell the rotation that ``tenants`` (rows of one column) have tasks due now, as a
    statement that makes tasks due does (due_marks): a store distributed by tenant has no
    trigger to do it."""
    await sql(
        store,
        "UPDATE toolkit_tenants SET next_due = least(next_due, now() - interval '1 second')"
        " WHERE NOT ready AND tenant = ANY(%s)",
        sorted({row[0] for row in tenants}),
    )


async def branch_due(store: Store, task_id: int, name: str) -> None:
    """Row surgery: the timer of waiting branch ``name`` has passed, and the task is due."""
    await sql(
        store,
        "UPDATE toolkit_branches SET run_at = statement_timestamp()"
        " WHERE task_id = %s AND name = %s AND status = 'waiting'",
        task_id,
        name,
    )
    await make_due(store, task_id)


async def kinds(store: Store, task_id: int) -> list[str]:
    """The kinds of a task's events, oldest first."""
    return [event["kind"] for event in await store.tasks.events(task_id)]


async def task_detail(store: Store, task_id: int) -> TaskDetail:
    """The notebook's detail of a task: its row, events, evidence, signals and branches."""
    return TaskDetail(
        task=await store.tasks.get(task_id),
        events=await store.tasks.events(task_id),
        evidence=await store.tasks.evidence(task_id),
        signals=await store.tasks.signals(task_id),
        branches=await store.branches.of_task(task_id),
    )


async def due_in(store: Store, task_id: int) -> float:
    """Seconds from now until the task's ``run_at``, in database time."""
    rows = await sql(
        store,
        "SELECT extract(epoch FROM run_at - clock_timestamp())::float8 FROM toolkit_tasks"
        " WHERE id = %s",
        task_id,
    )
    return float(rows[0][0])


# --- the command, in-process ------------------------------------------------------------------


def invoke(dsn: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env={"TOOLKIT_DSN": dsn}, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# --- running the counting app's workflows until idle ------------------------------------------

#: The configuration of ``run_until_idle`` (a longer idle backoff than ``FAST``).
WORKER_FAST = dict(lease=6.0, heartbeat=0.5, idle_backoff_min=0.01, idle_backoff_max=0.1)


async def run_until_idle(store: Store, *texts: str, **config: Any):
    definitions = [definition(t) for t in texts]
    worker = Worker(store, app, definitions)
    return await WorkflowSupervisor(
        worker, SupervisorConfig(until_idle=True, **{**WORKER_FAST, **config})
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


# --- tenant budgets ---------------------------------------------------------------------------


async def set_tenant_budget(
    store: Store, tenant: str, amount: float, used: float = 0, reserved: float = 0
) -> None:
    """The tenant's ``tokens`` budget: ``used`` (spent plus reserved), ``reserved`` of it."""
    await sql(
        store,
        "INSERT INTO toolkit_tenants (tenant) VALUES (%s) ON CONFLICT DO NOTHING",
        tenant,
    )
    await sql(
        store,
        "INSERT INTO toolkit_tenant_budgets (tenant, resource, amount, used, reserved) "
        "VALUES (%s, 'tokens', %s, %s, %s) ON CONFLICT (tenant, resource) "
        "DO UPDATE SET amount = excluded.amount, used = excluded.used, "
        "reserved = excluded.reserved",
        tenant, amount, used, reserved,
    )  # fmt: skip


async def tenant_use(store: Store, tenant: str) -> tuple[float, float]:
    """The tenant's ``tokens`` use: (used, reserved)."""
    rows = await sql(
        store,
        "SELECT used::float8, reserved::float8 FROM toolkit_tenant_budgets"
        " WHERE tenant = %s AND resource = 'tokens'",
        tenant,
    )
    return rows[0]


# --- tasks waiting for reconciliation --------------------------------------------------------


async def leave_uncertain(store: Store, count: int) -> list[int]:
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
        store, "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() - interval '1s'"
    )
    await drain(store, UNCERTAIN)
    for task_id in ids:
        task = await store.tasks.get(task_id)
        assert (task.state, task.wait_reason) == ("waiting", "reconciliation")
    return ids
