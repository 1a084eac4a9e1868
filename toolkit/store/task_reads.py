"""Reading tasks: one task, pages of the tasks a filter matches, counts, and a task's result.

:class:`TaskReads` is the reading half of :class:`~toolkit.store.tasks.Tasks`; the other
half submits tasks and acts on them.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime
import math
import time
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg

from toolkit.errors import TaskCancelled, TaskFailed, UnknownTask, WaitTimedOut
from toolkit.lifecycle import TaskState
from toolkit.store.database import Database
from toolkit.store.filters import TaskFilter
from toolkit.store.task_notices import listen, task_news
from toolkit.store.task_tenants import task_tenant, unknown_task

#: States a task never leaves.
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
#: The channel on which an awaited task's ending is announced (payload: its id).
ENDED_CHANNEL: LiteralString = "LISTEN toolkit_task_ended"


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """A task row as stored (DESIGN §2, "Workflow Task")."""

    id: int
    tenant: str
    definition_name: str
    definition_version: int
    definition_digest: str
    input: Any
    state: str
    wait_reason: str | None
    run_at: datetime.datetime
    checkpoint: dict[str, Any]
    lease_owner: str | None
    lease_token: int
    lease_expires_at: datetime.datetime | None
    attempts: int
    result: Any
    error: Any
    cancel_requested: Any
    idempotency_key: str | None
    tags: dict[str, str]
    schedule_name: str | None
    scheduled_at: datetime.datetime | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    finished_at: datetime.datetime | None
    #: the key value of the definition's ``concurrency`` (docs/flow-control.md), or None
    concurrency_key: str | None = None
    #: whether the task holds its concurrency key (it was admitted and has not ended)
    key_held: bool = False
    #: 0 (lowest) to 9: the order of due tasks inside the tenant's share
    priority: int = 0
    #: items its handlers published so far (``ctx.publish``, docs/progress.md)
    stream_seq: int = 0
    #: a child task's parent, and the step occurrence of it that started the child
    parent_id: int | None = None
    parent_occurrence: str | None = None
    #: a distributed map's child: the index of its first item (docs/composition.md)
    map_index: int | None = None
    #: the workflow deadline (its ``timeout``, or ``submit --timeout``): the task fails with
    #: ``Timeout`` if it has not ended by then; None: no deadline
    deadline_at: datetime.datetime | None = None


class TaskReads:
    """Read tasks, their evidence, events and signals; await a task's result."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, task_id: int, *, tenant: str | None = None) -> TaskRecord:
        """Read one task.

        Args:
            task_id: the task.
            tenant: its tenant, if known; else looked up by the id
                (:func:`~toolkit.store.task_tenants.task_tenant`).

        Raises:
            UnknownTask: no task has that id (under ``tenant``, when given).
        """
        params = {"task_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant)}
        row = await self._db.fetch_one("get_task", params)
        if row is None:
            raise unknown_task(task_id, tenant)
        return TaskRecord(**row)

    async def _filter_params(self, where: TaskFilter | None) -> dict[str, Any]:
        """The SQL parameters of a filter, its durations counted back from the database's now."""
        where = where or TaskFilter()
        now = await self.database_now() if where.has_time_bounds else datetime.datetime.now()
        return where.params(now)

    async def database_now(self) -> datetime.datetime:
        """The database's clock (time is always the database's, DESIGN §2)."""
        row = await self._db.fetch_one("database_now")
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]

    async def list(
        self,
        where: TaskFilter | None = None,
        /,
        *,
        before: int | None = None,
        limit: int = 100,
        **fields: Any,
    ) -> builtins.list[TaskRecord]:
        """One page of the tasks a filter matches, newest (highest id) first.

        Args:
            where: the filter; or give its fields as keywords (``state="failed"``,
                ``tags={"customer": "acme"}``: :class:`~toolkit.store.filters.TaskFilter`).
            before: only ids below this one: the last id of the previous page (keyset
                pagination: every task is on exactly one page, however many there are).
            limit: most tasks returned.
            fields: the filter's fields, instead of ``where``.

        Raises:
            InputError: a filter field is not valid (the field is named).
        """
        where = _filter(where, fields)
        params = {**await self._filter_params(where), "before": before, "limit": limit}
        rows = await self._db.fetch_all("list_tasks", params, prepare=False)
        return [TaskRecord(**row) for row in rows]

    async def count(self, where: TaskFilter | None = None, /, **fields: Any) -> int:
        """How many tasks a filter matches.

        Args:
            where: the filter (as :meth:`list`).
            fields: the filter's fields, instead of ``where``.
        """
        where = _filter(where, fields)
        row = await self._db.fetch_one(
            "count_tasks", await self._filter_params(where), prepare=False
        )
        return int(row["n"]) if row else 0

    async def counts_by_state(self) -> dict[str, int]:
        """Number of tasks in each state present."""
        rows = await self._db.fetch_all("count_tasks_by_state")
        return {row["state"]: row["n"] for row in rows}

    async def matching_counts(
        self, where: TaskFilter | None = None
    ) -> builtins.list[tuple[str, str, int, int]]:
        """How many tasks a filter matches, by ``(state, definition name, version, count)``."""
        rows = await self._db.fetch_all(
            "count_matching_by_state", await self._filter_params(where), prepare=False
        )
        return [
            (r["state"], r["definition_name"], r["definition_version"], int(r["n"])) for r in rows
        ]

    async def evidence(
        self, task_id: int, *, tenant: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """The task's effect evidence records, oldest first (``tenant``: as :meth:`get`)."""
        params = {"task_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant)}
        return [dict(row) for row in await self._db.fetch_all("task_evidence", params)]

    async def events(
        self, task_id: int, *, tenant: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """The task's events (every transition), oldest first (``tenant``: as :meth:`get`)."""
        params = {"task_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant)}
        return [dict(row) for row in await self._db.fetch_all("task_events", params)]

    async def queue_position(self, task_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        """Why a due task is not running yet (``toolkit show``; ``tenant``: as :meth:`get`).

        Returns:
            ``{"due", "paused", "max_active", "active", "ahead", "served"}``: whether it is
            due (queued or waiting, its ``run_at`` come), its tenant's settings
            and unexpired leases, the due tasks of its tenant before it in claim order (at
            most 10,000 counted), and whether a live worker has loaded its definition.

        Raises:
            UnknownTask: no such task.
        """
        params = {"task_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant)}
        row = await self._db.fetch_one("task_queue_position", params)
        if row is None:
            raise UnknownTask(f"no task {task_id}")
        return dict(row)

    async def evidence_counts(self) -> dict[str, int]:
        """Number of evidence records of each kind, over all tasks."""
        rows = await self._db.fetch_all("count_evidence")
        return {row["record"]: row["n"] for row in rows}

    async def held(self) -> dict[tuple[str, str], int]:
        """Live tasks held back now, per (definition name, reason) (query ``held_tasks``).

        Reasons: ``concurrency``, ``debounce``, ``start``, ``budget``, ``limit`` (waiting, not
        due yet), ``tenant_paused`` and ``tenant_max_active`` (due, their tenant holds them);
        pairs with no task are absent. Reads every live task: for a periodic gauge
        (``toolkit_tasks_held``), not a hot path.
        """
        rows = await self._db.fetch_all("held_tasks")
        return {(row["definition_name"], row["reason"]): row["n"] for row in rows}

    async def idle_state(self, digests: Sequence[str]) -> tuple[bool, float | None]:
        """What an idle worker of these definitions needs to know, in one statement.

        Returns:
            ``(pending, next_due)``: whether a task is queued, leased or due, or a
            concurrency key has room for a task waiting for it; and the seconds until the
            earliest future ``run_at`` of a queued or waiting task (None if there is none).
        """
        row = await self._db.fetch_one("idle_state", {"digests": list(digests)})
        assert row is not None
        return bool(row["pending"]), row["next_due"]

    async def signals(
        self, task_id: int, *, tenant: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Every signal sent to the task, consumed or not, oldest first.

        Each: ``id``, ``name``, ``address`` (the branch it is for; None: the task as a
        whole), ``payload``, ``sent_at``, ``consumed_at``, ``consumed_by`` (the occurrence
        that took it), ``consumed_token``. ``tenant``: as :meth:`get`.
        """
        params = {"task_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant)}
        return [dict(row) for row in await self._db.fetch_all("task_signals", params)]

    async def result(
        self,
        task_id: int,
        *,
        timeout: float | None = None,
        poll: float = 5.0,
        tenant: str | None = None,
    ) -> Any:
        """Wait for a task to end; return its output, or raise its error.

        The task is marked awaited, so that its ending, by whatever statement, notifies
        channel ``toolkit_task_ended`` (LISTEN/NOTIFY, as workers are woken); the task is read
        again on each notification naming it and every ``poll`` seconds, the fallback when
        notifications cannot be received (the wait goes on without them).

        Args:
            task_id: the task.
            timeout: seconds to wait at most; None waits as long as it takes.
            poll: seconds between two reads without a notification.
            tenant: the task's tenant, if known (as :meth:`get`).

        Returns:
            The task's output (JSON) when it succeeded.

        Raises:
            UnknownTask: no such task.
            TaskFailed: it failed; ``error`` is its error (``name``, ``message``, ``step``).
            TaskCancelled: it was cancelled (a subclass of TaskFailed).
            WaitTimedOut: ``timeout`` passed first; ``state`` is the task's state then.
        """
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        listening: psycopg.AsyncConnection[Any] | None = None
        try:
            listening = await listen(self._db, [ENDED_CHANNEL], "runifold-wait")
            params = {"task_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant)}
            row = await self._db.fetch_one("await_task", params)
            while True:
                if row is None:
                    raise UnknownTask(f"no task {task_id}")
                if row["state"] in TERMINAL_STATES:
                    return _outcome(task_id, row)
                left = deadline - time.monotonic()
                if left <= 0:
                    state = TaskState(row["state"]).phrase(row["wait_reason"])
                    raise WaitTimedOut(
                        f"task {task_id} {state} after {timeout:g} s of waiting; it goes on",
                        task_id=task_id,
                        state=row["state"],
                    )
                async for _ in task_news(listening, task_id, min(poll, left)):
                    pass  # progress values are not wanted here
                row = await self._db.fetch_one("get_task", params)
        finally:
            if listening is not None:
                await listening.close()


def _outcome(task_id: int, row: dict[str, Any]) -> Any:
    """An ended task's output, or its error raised."""
    if row["state"] == "succeeded":
        return row["result"]
    error = dict(row["error"] or {})
    detail = f"{error.get('name', 'Error')}: {error.get('message', '')}".rstrip(": ")
    if row["state"] == "cancelled":
        why = error.get("message") or "cancelled by request"
        raise TaskCancelled(f"task {task_id} was cancelled: {why}", task_id=task_id, error=error)
    where = f" at step {error['step']}" if error.get("step") else ""
    raise TaskFailed(f"task {task_id} failed{where}: {detail}", task_id=task_id, error=error)


def _filter(where: TaskFilter | None, fields: dict[str, Any]) -> TaskFilter | None:
    """The filter given, or built from keyword fields (not both)."""
    if fields:
        if where is not None:
            raise TypeError("give a TaskFilter or its fields as keywords, not both")
        return TaskFilter(**fields)
    return where
