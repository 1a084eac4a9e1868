"""The triggers whose work the statements now do (issue 25; migrations 0029 to 0031).

A distributed table can have no trigger, so the statements that end tasks, make tasks due
sooner, put a tenant in the rotation or insert keyed tasks do that work themselves; the
triggers stay only for the previous release's workers during an upgrade. Tests of that work
run with both: as migrated, and as a distributed store will be, without the triggers (the
``ending``, ``marking`` and ``keying`` fixtures, tests/conftest.py; docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from toolkit.store import Store

#: What a task's end does (migration 0029): (table, trigger).
ENDING_TRIGGERS = (
    ("toolkit_tasks", "toolkit_tasks_return_reservation"),
    ("toolkit_tasks", "toolkit_tasks_notify_ended"),
    ("toolkit_tasks", "toolkit_tasks_count_schedule_outcome"),
    ("toolkit_tasks", "toolkit_tasks_release_key"),
)

#: The tenant rotation's marks and joins (migration 0030): (table, trigger).
ROTATION_TRIGGERS = (
    ("toolkit_tasks", "toolkit_tasks_inserted_due"),
    ("toolkit_tasks", "toolkit_tasks_due_sooner"),
    ("toolkit_tenants", "toolkit_tenants_join_rotation"),
    ("toolkit_tenants", "toolkit_tenants_rejoin_rotation"),
)

#: A keyed task's admission or parking at its insert or redrive (migration 0031).
KEY_TRIGGERS = (
    ("toolkit_tasks", "toolkit_tasks_park_for_key"),
    ("toolkit_tasks", "toolkit_tasks_repark_for_key"),
)


async def drop_triggers(store: Store, triggers: Iterable[tuple[str, str]]) -> Store:
    """``store`` without ``triggers`` ((table, trigger) pairs), as a distributed store is."""
    async with store.db.connection() as conn:
        for table, trigger in triggers:
            await conn.execute(f"DROP TRIGGER {trigger} ON {table}")
    return store


async def as_distributed(store: Store) -> Store:
    """``store`` (one PostgreSQL) running the statements a store distributed by tenant runs:
    without the triggers, and its claims, heartbeats, group commits and key admissions
    made tenant by tenant (``toolkit.store.distributed_leases``). Those statements are plain
    SQL; this runs them where CI runs, which has no Citus (docs/scaling.md)."""
    await drop_triggers(store, ENDING_TRIGGERS + ROTATION_TRIGGERS + KEY_TRIGGERS)
    store.db.distributed = True
    return store
