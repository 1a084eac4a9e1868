"""The child tasks of distributed map steps: start a page of them, count them, read them.

A ``map: {distributed: true}`` step (docs/composition.md#distributed-map) runs its items as
child tasks in the parent's tenant, one per item or per batch of ``items_per_task``. Each is
keyed by ``(parent, occurrence/map_index)`` (``map_index``: the index of its first item), so
a page started again after a crash of the parent starts none twice. An item task does not
wake its parent when it ends (the parent counts them at intervals, :meth:`MapItems.progress`),
and its own row keeps its result or error: the per-item results (:meth:`MapItems.results`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.definition import WorkflowDefinition
from toolkit.errors import LeaseLost
from toolkit.store.children import child_params
from toolkit.store.database import Database
from toolkit.store.fence import Fence, fence_params
from toolkit.store.key_locks import insert_keyed
from toolkit.store.task_tenants import task_tenant

#: Failed item tasks a summary lists (the step's output keeps them as its ``errors``).
ERRORS_SHOWN = 10


@dataclasses.dataclass(frozen=True)
class NewItemTask:
    """One child task of a page of a distributed map, before it is started.

    Attributes:
        map_index: the index of its first item.
        input: its input (the item, or ``{"items": [...], "first_index": N}``).
        tags: the tags its definition gives it.
        error: why its input was refused (``{"name", "message"}``): it starts failed.
        concurrency: its concurrency key and limit (the map's ``max_concurrency``, or its
            definition's ``concurrency``), or None.
    """

    map_index: int
    input: Any
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    error: Mapping[str, Any] | None = None
    concurrency: tuple[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        """The row of ``start_map_items``."""
        key, limit = self.concurrency if self.error is None and self.concurrency else (None, None)
        return {
            "map_index": self.map_index, "input": self.input, "tags": dict(self.tags),
            "error": self.error, "concurrency_key": key, "concurrency_limit": limit,
        }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MapProgress:
    """How far a distributed map's child tasks are, as counted while they run.

    Attributes:
        live: child tasks still queued, leased or waiting.
        failed: items of the child tasks that failed or were cancelled.
    """

    live: int
    failed: int


@dataclasses.dataclass(frozen=True)
class MapSummary:
    """Where all of a distributed map's child tasks stand (the step's output).

    Attributes:
        tasks: child tasks started.
        live: those still queued, leased or waiting.
        succeeded: items of the tasks that succeeded.
        failed: items of the tasks that failed or were cancelled.
        errors: the first failed or cancelled tasks, in item order: ``{"index", "items",
            "task_id", "state", "error"}`` each.
    """

    tasks: int
    live: int
    succeeded: int
    failed: int
    errors: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class MapItemResult:
    """One child task of a distributed map, as the per-item results show it.

    Attributes:
        task_id: the child task's id.
        occurrence: the map step occurrence that started it (e.g. ``"process#1"``).
        index: the index of its first item.
        state: its state.
        input: its input.
        result: its result once succeeded.
        error: its error once failed or cancelled.
        finished_at: when it ended, or None.
    """

    task_id: int
    occurrence: str
    index: int
    state: str
    input: Any
    result: Any
    error: Mapping[str, Any] | None
    finished_at: datetime.datetime | None


class MapItems:
    """The child tasks of distributed map steps, of one store."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def start(
        self,
        fence: Fence,
        occurrence: str,
        definition: WorkflowDefinition,
        items: Sequence[NewItemTask],
    ) -> int:
        """Start the child tasks of a page (those not started already); return how many.

        Args:
            fence: the parent's lease (the children get its tenant and tags).
            occurrence: the map step's occurrence (e.g. ``"process#1"``).
            definition: the children's definition (the version they are pinned to).
            items: the page's child tasks.

        Raises:
            LeaseLost: the parent's lease is no longer held; nothing was started.
            DatabaseUnavailable: the database cannot be reached (call again: still once each).
        """
        params = {
            **fence_params(fence),
            **child_params(definition),
            "occurrence": occurrence,
            "items": Jsonb([item.to_json() for item in items]),
        }
        held = [(fence.tenant, definition.name, item.concurrency[0])
                for item in items if item.error is None and item.concurrency]  # fmt: skip
        rows = await insert_keyed(self._db, "start_map_items", params, held)
        row = rows[0] if rows else None
        if row is None or row["parent_id"] is None:
            raise LeaseLost(f"task {fence.task_id}: lease lost before its map items started")
        return int(row["inserted"])

    async def progress(
        self, parent_id: int, occurrence: str, listed: int, *, tenant: str
    ) -> MapProgress:
        """Count the live children and the failed items of map occurrence ``occurrence``.

        Reads the live and the failed children only, not every child (``listed``: the items
        listed in all, where the last task's items end; ``tenant``: the parent's).
        """
        row = await self._db.fetch_one(
            "map_progress",
            {"parent_id": parent_id, "tenant": tenant, "occurrence": occurrence,
             "listed": listed},
        )  # fmt: skip
        assert row is not None, "sub-selects give a row"
        return MapProgress(live=row["live"], failed=row["failed"])

    async def summary(
        self, parent_id: int, occurrence: str, listed: int, *, tenant: str
    ) -> MapSummary:
        """Count every child of map occurrence ``occurrence``, and its first failures.

        ``tenant``: the parent's.
        """
        row = await self._db.fetch_one(
            "map_summary",
            {"parent_id": parent_id, "tenant": tenant, "occurrence": occurrence,
             "listed": listed, "errors": ERRORS_SHOWN},
        )  # fmt: skip
        assert row is not None, "an aggregate has a row"
        return MapSummary(
            tasks=row["tasks"], live=row["live"], succeeded=row["succeeded"],
            failed=row["failed"], errors=list(row["errors"]),
        )  # fmt: skip

    async def cancel_live(self, fence: Fence, occurrence: str, reason: str) -> list[int]:
        """Cancel the live child tasks of map occurrence ``occurrence``; return their ids.

        A queued or waiting one ends at once, a leased one at its next heartbeat (as
        ``toolkit cancel`` does); their own children are the caller's to cancel. Fenced by
        the parent's lease: a parent that lost it cancels nothing.
        """
        row = await self._db.fetch_one(
            "cancel_map_items",
            {**fence_params(fence), "occurrence": occurrence, "reason": reason,
             "plan_id": None, "operator": None},
        )  # fmt: skip
        return list(row["ids"]) if row else []

    async def results(
        self,
        task_id: int,
        *,
        occurrence: str | None = None,
        state: str | None = None,
        after: int = 0,
        limit: int = 1000,
        tenant: str | None = None,
    ) -> list[MapItemResult]:
        """The per-item results of task ``task_id``'s distributed map steps, in item order.

        Args:
            task_id: the parent task.
            occurrence: only this map step occurrence's (e.g. ``"process#1"``); None: all.
            state: only tasks in this state (e.g. ``"failed"``); None: all.
            after: from this item index on (a page's last index + 1 reads the next page).
            limit: at most this many rows.
            tenant: the task's tenant, if known; else looked up by the id
                (:func:`~toolkit.store.task_tenants.task_tenant`).
        """
        rows = await self._db.fetch_all(
            "map_item_results",
            {"parent_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant),
             "occurrence": occurrence, "state": state, "after": after, "limit": limit},
        )  # fmt: skip
        return [
            MapItemResult(
                task_id=row["id"],
                occurrence=row["parent_occurrence"].rsplit("/", 1)[0],
                index=row["map_index"],
                state=row["state"],
                input=row["input"],
                result=row["result"],
                error=row["error"],
                finished_at=row["finished_at"],
            )
            for row in rows
        ]
