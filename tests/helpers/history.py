"""The history tests' workload: the definitions of ``tests.helpers.workflows`` (``FLOW``,
``BROKEN``, ``WAITER``) run by the app of ``tests.apps.history``, and how they are deployed,
submitted and drained (shared by the export, retention and notebook tests)."""

from __future__ import annotations

from typing import Any

import anyio

from tests.apps.history import app
from tests.helpers.workflows import BROKEN, DEFINITIONS, FLOW
from toolkit.definition import WorkflowDefinition
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store


async def run_until_idle(store: Store, definitions: list[WorkflowDefinition]) -> None:
    worker = Worker(store, app, definitions, worker_id="history-test-worker")
    await WorkflowSupervisor(worker, SupervisorConfig(concurrency=4, until_idle=True)).run()


async def deploy(store: Store) -> None:
    for d in DEFINITIONS:
        await store.definitions.deploy(d)


async def submit_and_run(store: Store, flows: int = 3, broken: int = 1) -> None:
    await store.tasks.submit(FLOW, [{"n": i} for i in range(flows)], tenant="acme")
    if broken:
        await store.tasks.submit(BROKEN, [{}] * broken, tenant="globex")
    await run_until_idle(store, DEFINITIONS)


def with_store(dsn: str, body: Any) -> None:
    async def main() -> None:
        async with await Store.open(dsn, migrate_schema=False) as store:
            await body(store)

    anyio.run(main, backend="asyncio")
