"""Which tenant a task belongs to, for the statements that name a task by its id.

Every per-task statement names the task's tenant beside its id (issue 25, docs/scaling.md
"Every per-task statement carries the tenant"): on a store distributed by tenant (Citus)
that is what routes it to the one node holding the task. A worker knows the tenant from
its claim, and passes it; an operator's call (``toolkit show``, ``signal``, ``cancel``,
``reconcile``, ``redrive``, ``wait``, ``watch``, and their Python methods) may give it
(``tenant=``, ``--tenant``), or it is looked up here by the id: one index probe on one
PostgreSQL, a read of every node on Citus. A task's tenant never changes and an id is never
reused, so what was looked up is remembered, for the last :data:`REMEMBERED` tasks of the
process.
"""

from __future__ import annotations

from toolkit.errors import UnknownTask
from toolkit.store.database import Database

#: How many tasks' tenants a process remembers (a dict of ints and short strings: about
#: 100 bytes each).
REMEMBERED = 10_000


async def task_tenant(
    db: Database,
    task_id: int,
    tenant: str | None = None,
) -> str | None:
    """The tenant of task ``task_id``, to name beside its id in a statement.

    Args:
        db: the store's database (its ``task_tenants`` remembers lookups).
        task_id: the task.
        tenant: the tenant, when the caller knows it: returned as it is, unchecked (a wrong
            one makes the statement find no task, as an unknown id does).

    Returns:
        The tenant, or None when no task has that id (a statement given None finds no
        task: the caller reports the id as unknown, as before).

    Raises:
        DatabaseUnavailable, StoreError: the lookup failed.
    """
    if tenant is not None:
        return tenant
    remembered = db.task_tenants.get(task_id)
    if remembered is not None:
        return remembered
    row = await db.fetch_one("task_tenant", {"task_id": task_id})
    if row is None:
        return None
    _remember(db, task_id, row["tenant"])
    return str(row["tenant"])


def unknown_task(task_id: int, tenant: str | None) -> UnknownTask:
    """The error for a task no statement found under ``tenant`` (None: not given).

    ``no task 7``, or ``no task 7 of tenant 'acme'`` when the caller gave its tenant.
    """
    return UnknownTask(f"no task {task_id}" + (f" of tenant {tenant!r}" if tenant else ""))


def _remember(db: Database, task_id: int, tenant: str) -> None:
    """Remember task ``task_id``'s tenant, forgetting the oldest past :data:`REMEMBERED`."""
    known = db.task_tenants
    if len(known) >= REMEMBERED:
        del known[next(iter(known))]
    known[task_id] = tenant
