"""Task submission and reads: what the CLI, the notebook and tests look at."""

from __future__ import annotations

import builtins
import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.checkpoint import Checkpoint
from toolkit.database import Database
from toolkit.definition import WorkflowDefinition
from toolkit.errors import UnknownTask


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
    created_at: datetime.datetime
    updated_at: datetime.datetime
    finished_at: datetime.datetime | None


class Tasks:
    """Submit tasks and read their state, evidence and history."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def submit(
        self,
        definition: WorkflowDefinition,
        inputs: Sequence[Any],
        *,
        tenant: str = "default",
    ) -> list[int]:
        """Queue one task per input, validated against the definition's input schema.

        All inputs are validated before anything is written; idle workers are woken by a
        NOTIFY carrying no data.

        Args:
            definition: a deployed definition; the tasks are pinned to its digest.
            inputs: task inputs (JSON values).
            tenant: the tenant the tasks belong to.

        Returns:
            The new task ids, in input order.

        Raises:
            InputError: an input fails the input schema (nothing written).
        """
        validated = [definition.validate_input(value) for value in inputs]
        if not validated:
            return []
        rows = await self._db.fetch_all(
            "submit_tasks",
            {
                "tenant": tenant,
                "name": definition.name,
                "version": definition.version,
                "digest": definition.digest,
                "inputs": Jsonb(validated),
                "checkpoint": Jsonb(Checkpoint.initial(definition.start).to_json()),
            },
        )
        return [row["id"] for row in rows]

    async def get(self, task_id: int) -> TaskRecord:
        """Read one task.

        Raises:
            UnknownTask: no task has that id.
        """
        row = await self._db.fetch_one("get_task", {"task_id": task_id})
        if row is None:
            raise UnknownTask(f"no task {task_id}")
        return TaskRecord(**row)

    async def list(
        self,
        *,
        state: str | None = None,
        tenant: str | None = None,
        name: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """The newest tasks matching every filter given, newest first."""
        rows = await self._db.fetch_all(
            "list_tasks", {"state": state, "tenant": tenant, "name": name, "limit": limit}
        )
        return [TaskRecord(**row) for row in rows]

    async def counts_by_state(self) -> dict[str, int]:
        """Number of tasks in each state present."""
        rows = await self._db.fetch_all("count_tasks_by_state")
        return {row["state"]: row["n"] for row in rows}

    async def evidence(self, task_id: int) -> builtins.list[dict[str, Any]]:
        """The task's effect evidence records, oldest first."""
        return [
            dict(row) for row in await self._db.fetch_all("task_evidence", {"task_id": task_id})
        ]

    async def events(self, task_id: int) -> builtins.list[dict[str, Any]]:
        """The task's events (every transition), oldest first."""
        return [dict(row) for row in await self._db.fetch_all("task_events", {"task_id": task_id})]

    async def evidence_counts(self) -> dict[str, int]:
        """Number of evidence records of each kind, over all tasks."""
        rows = await self._db.fetch_all("count_evidence")
        return {row["record"]: row["n"] for row in rows}

    async def pending_work(self, digests: Sequence[str]) -> bool:
        """True while a task of these definitions is queued or leased."""
        row = await self._db.fetch_one("pending_work_exists", {"digests": list(digests)})
        return bool(row and row["pending"])
