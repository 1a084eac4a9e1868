"""Every per-task statement names the task's tenant beside its id (issue 25, docs/scaling.md
"Every per-task statement carries the tenant"): a worker passes the tenant of its claim and
never looks one up; an operator's call gives it or has it looked up by the id, once per
task and process (toolkit/store/task_tenants.py)."""

from __future__ import annotations

import re

import pytest

from tests.apps import golden
from tests.engine.golden.steps import ITEM
from tests.helpers.workflows import definition
from toolkit.errors import CallbackRefused, UnknownTask
from toolkit.runtime.config import SupervisorConfig
from toolkit.runtime.supervisor import WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store, task_tenants
from toolkit.store.queries import query, query_names

pytestmark = pytest.mark.anyio

#: Statements that name one task but not its tenant, and why.
WITHOUT_THE_TENANT = {
    "task_tenant": "the lookup of the tenant itself",
}


def test_every_statement_naming_one_task_names_its_tenant() -> None:
    naming = [n for n in query_names() if re.search(r"%\((task_id|parent_id)\)s", query(n))]
    assert len(naming) > 30, naming  # the scan finds them
    missing = [n for n in naming if "%(tenant)s" not in query(n) and n not in WITHOUT_THE_TENANT]
    assert missing == [], missing
    stale = [n for n in WITHOUT_THE_TENANT if n not in naming or "%(tenant)s" in query(n)]
    assert stale == [], stale


async def test_an_operators_read_looks_the_tenant_up_once(store: Store) -> None:
    d = definition(ECHO)
    await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(d, [{}], tenant="acme")
    store.db.task_tenants.clear()  # a submit may remember its own tasks some day
    assert (await store.tasks.get(task_id)).tenant == "acme"
    assert store.db.task_tenants == {task_id: "acme"}
    assert [e["kind"] for e in await store.tasks.events(task_id)] == ["submitted"]
    # Given, the tenant is used as it is: another tenant's task is not found, and nothing
    # is done to it.
    with pytest.raises(UnknownTask, match=f"no task {task_id} of tenant 'globex'"):
        await store.tasks.get(task_id, tenant="globex")
    with pytest.raises(UnknownTask, match=f"no task {task_id} of tenant 'globex'"):
        await store.tasks.cancel(task_id, tenant="globex")
    with pytest.raises(UnknownTask, match=f"no task {task_id} of tenant 'globex'"):
        await store.tasks.signal(task_id, "go", force=True, tenant="globex")
    assert (await store.tasks.get(task_id)).state == "queued"
    assert await store.tasks.signals(task_id) == []
    # An unknown id is reported as before, and nothing is remembered for it; an unknown
    # callback token likewise (regression: on Citus both reached a statement without a
    # tenant, which the cluster refused with its own error).
    for act in (store.tasks.get, store.tasks.cancel):
        with pytest.raises(UnknownTask, match=f"^no task {task_id + 100}$"):
            await act(task_id + 100)
    assert task_id + 100 not in store.db.task_tenants
    with pytest.raises(CallbackRefused, match="no callback token 'cb_nosuch'"):
        await store.tasks.complete("cb_nosuch", result={})


async def test_the_remembered_tenants_are_bounded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_tenants, "REMEMBERED", 2)
    d = definition(ECHO)
    await store.definitions.deploy(d)
    ids = [(await store.tasks.submit(d, [{}], tenant=f"t{i}"))[0] for i in range(3)]
    for task_id in ids:
        await store.tasks.get(task_id)
    assert store.db.task_tenants == {ids[1]: "t1", ids[2]: "t2"}


async def test_a_worker_never_looks_a_tenant_up(store: Store) -> None:
    """Branches, their signal waits, a child, a distributed map and a task-level signal:
    the worker names the tenant of its claims in every statement; the operator's signals,
    sent through another store, look theirs up."""
    defs = [definition(JOURNEY), definition(ECHO), definition(ITEM)]
    for d in defs:
        await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(defs[0], [{}], tenant="acme")
    async with await Store.open(store.db.dsn, migrate_schema=False) as worker_store:
        worker = Worker(worker_store, golden.app, defs)
        config = SupervisorConfig(until_idle=True, lease=6.0, heartbeat=0.5)
        await WorkflowSupervisor(worker, config).run()
        task = await store.tasks.get(task_id)
        assert (task.state, task.wait_reason) == ("waiting", "branches"), task
        await store.tasks.signal(task_id, "approve", {"ok": True})
        await WorkflowSupervisor(worker, config).run()
        task = await store.tasks.get(task_id)
        assert (task.state, task.wait_reason) == ("waiting", "signal"), task
        await store.tasks.signal(task_id, "finish", {})
        await WorkflowSupervisor(worker, config).run()
        task = await store.tasks.get(task_id)
        assert task.state == "succeeded", (task, await store.tasks.events(task_id))
        assert worker_store.db.task_tenants == {}
    assert store.db.task_tenants == {task_id: "acme"}


JOURNEY = """
name: tenant-journey
version: 1
start: both
steps:
  both:
    parallel:
      branches:
        asks:
          start: ask
          steps:
            ask: {wait: {signal: approve}}
        calls:
          start: call
          steps:
            call: {effect: golden.echo, idempotent: true}
    next: child
  child: {workflow: {name: tenant-echo}, next: items}
  items:
    map:
      distributed: true
      items_from: {effect: golden.pages}
      workflow: {name: golden-item}
      tolerated_failures: 1
    next: last
  last: {wait: {signal: finish}}
"""

ECHO = """
name: tenant-echo
version: 1
start: call
steps:
  call: {effect: golden.echo, idempotent: true}
"""
