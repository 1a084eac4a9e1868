"""Every row of a per-task table carries its task's tenant (migration 0026, issue 25).

Checked after every test that uses the ``store`` fixture (tests/conftest.py), so each
statement that stores such a row, whichever feature a test drives, is held to it.
"""

from __future__ import annotations

import psycopg

from toolkit.store import Store

#: The tables whose rows belong to one task (``task_id``) and carry its tenant.
PER_TASK_TABLES = (
    "toolkit_effect_evidence",
    "toolkit_task_events",
    "toolkit_signals",
    "toolkit_callbacks",
    "toolkit_limit_slots",
    "toolkit_branches",
    "toolkit_task_stream",
    "toolkit_event_subscriptions",
)

# (an anti-join on the tenant too: on a store distributed by tenant it runs on each shard, as
# a join by the task id alone could not)
_UNDER_ANOTHER_TENANT = " UNION ALL ".join(
    f"SELECT '{table}', x.task_id, x.tenant FROM {table} x WHERE NOT EXISTS "
    "(SELECT 1 FROM toolkit_tasks t WHERE t.id = x.task_id AND t.tenant = x.tenant)"
    for table in PER_TASK_TABLES
)


async def rows_under_another_tenant(store: Store) -> list[tuple[str, int, str]]:
    """(table, task id, the row's tenant) of every row not under its task's tenant.

    Empty when the database cannot answer (a test that stopped its server or dropped the
    schema): such a test checks something else.
    """
    try:
        async with store.db.connection() as conn:
            return list(await (await conn.execute(_UNDER_ANOTHER_TENANT)).fetchall())
    except (psycopg.Error, OSError):
        return []


#: The live tasks that a tenant out of the rotation would leave unclaimed: the tenant is not
#: ready and its next_due is after the task is due (migration 0020's invariant; a task of
#: negative priority is due only that many minutes later, as the demotion reads it).
_MISSED_BY_THE_ROTATION = """
SELECT tn.tenant, tn.next_due, t.id, t.state, t.wait_reason, t.run_at, t.lease_expires_at,
       t.priority
FROM toolkit_tenants tn
JOIN toolkit_tasks t ON t.tenant = tn.tenant AND t.state IN ('queued', 'leased', 'waiting')
WHERE NOT tn.ready
  AND coalesce(tn.next_due, 'infinity')
      > CASE WHEN t.state = 'leased' THEN t.lease_expires_at ELSE t.run_at END
        - least(t.priority, 0) * interval '1 minute'
ORDER BY t.id
"""


async def tasks_missed_by_the_rotation(store: Store) -> list[tuple[object, ...]]:
    """(tenant, next_due, task id, state, wait_reason, run_at, lease_expires_at, priority) of
    every live task due before its tenant, out of the rotation, would be claimed again.

    The statements that make tasks due keep this empty themselves (``due_marks``, migration
    0030); checked after every test that uses the ``store`` fixture. Empty when the database
    cannot answer.
    """
    try:
        async with store.db.connection() as conn:
            return list(await (await conn.execute(_MISSED_BY_THE_ROTATION)).fetchall())
    except (psycopg.Error, OSError):
        return []


#: The concurrency keys held by more live tasks than their max_active allows.
_KEYS_OVER_MAX_ACTIVE = """
SELECT tenant, definition_name, concurrency_key, count(*) AS holders,
       min(concurrency_limit) AS max_active, array_agg(id ORDER BY id) AS tasks
FROM toolkit_tasks
WHERE key_held AND state IN ('queued', 'leased', 'waiting')
GROUP BY tenant, definition_name, concurrency_key
HAVING count(*) > min(concurrency_limit)
"""


async def keys_over_max_active(store: Store) -> list[tuple[object, ...]]:
    """(tenant, definition, key, holders, max_active, task ids) of every key held by more
    live tasks than its max_active (docs/flow-control.md).

    The inserts and the admission keep this empty (migration 0031); checked after every
    test that uses the ``store`` fixture. Empty when the database cannot answer.
    """
    try:
        async with store.db.connection() as conn:
            return list(await (await conn.execute(_KEYS_OVER_MAX_ACTIVE)).fetchall())
    except (psycopg.Error, OSError):
        return []
