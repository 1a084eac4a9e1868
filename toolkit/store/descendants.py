"""Cancelling the live descendants of cancelled tasks, a batch per statement.

A task cancelled (by an operator, its deadline, a distributed map that failed) takes its
live child tasks with it, and theirs. A distributed map's parent may have tens of thousands:
they are cancelled :data:`CANCEL_BATCH` per statement (``cancel_tasks``), not one each.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from psycopg.rows import DictRow

from toolkit.store.database import Database, Params

#: Descendants of one cancelled task cancelled per statement at most.
CANCEL_BATCH = 1000


async def cancel_descendants(
    db: Database, task_ids: Sequence[int], tenant: str | None = None
) -> int:
    """Cancel the live descendants of the cancelled tasks ``task_ids``, as ``toolkit cancel``.

    ``tenant``: theirs when they have one (a child has its parent's), None for several.

    A queued or waiting one ends at once, a leased one gets a request its holder learns of
    at its next heartbeat; the reason names its cancelled ancestor. A child cancelled at
    once wakes a branch of its parent waiting for it (``wake_parent_branches``, in the same
    transaction).

    Returns:
        How many were cancelled or asked to stop.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    children = await db.fetch_all("live_children", {"task_ids": list(task_ids), "tenant": tenant})
    by_root: dict[int, list[int]] = {}
    for child in children:
        by_root.setdefault(child["root"], []).append(child["id"])
    for root, ids in by_root.items():
        for start in range(0, len(ids), CANCEL_BATCH):
            params = {
                "task_ids": ids[start : start + CANCEL_BATCH],
                "reason": f"parent task {root} cancelled",
                "plan_id": None,
                "operator": None,
                "tenant": tenant,
            }
            await db.fetch_all_then("cancel_tasks", params, functools.partial(_woken, tenant))
    return len(children)


def _woken(tenant: str | None, rows: list[DictRow]) -> tuple[str, Params] | None:
    """The wake of the parents' branches after ``cancel_tasks`` (``rows``)."""
    cancelled = list(rows[0]["cancelled"]) if rows else []
    return ended_children(cancelled, tenant)


def ended_children(
    task_ids: Sequence[int], tenant: str | None
) -> tuple[str, dict[str, Any]] | None:
    """The ``wake_parent_branches`` statement for tasks that just ended, or None for none.

    ``tenant``: theirs when they have one (a parent has its child's), None for several.
    """
    if not task_ids:
        return None
    return "wake_parent_branches", {"task_ids": list(task_ids), "tenant": tenant}
