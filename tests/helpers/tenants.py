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

_UNDER_ANOTHER_TENANT = " UNION ALL ".join(
    f"SELECT '{table}', x.task_id, x.tenant, t.tenant FROM {table} x "
    "JOIN toolkit_tasks t ON t.id = x.task_id WHERE x.tenant IS DISTINCT FROM t.tenant"
    for table in PER_TASK_TABLES
)


async def rows_under_another_tenant(store: Store) -> list[tuple[str, int, str, str]]:
    """(table, task id, the row's tenant, the task's) of every row not under its task's tenant.

    Empty when the database cannot answer (a test that stopped its server or dropped the
    schema): such a test checks something else.
    """
    try:
        async with store.db.connection() as conn:
            return list(await (await conn.execute(_UNDER_ANOTHER_TENANT)).fetchall())
    except (psycopg.Error, OSError):
        return []
