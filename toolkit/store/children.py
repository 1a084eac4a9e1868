"""Child workflows in the store: start a child once per step occurrence, read it back.

A ``workflow`` step starts a child task in the parent's tenant, pinned to a resolved
definition version, and the parent waits (reason ``child``) without a lease. The child is
keyed by ``(parent, occurrence)``, so a parent that crashes after starting it finds it again
rather than starting a second. A child that ends wakes its parent (``commit_fenced``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.checkpoint import Checkpoint
from toolkit.definition import WorkflowDefinition
from toolkit.errors import LeaseLost
from toolkit.store.database import Database
from toolkit.store.fence import Fence, fence_params
from toolkit.store.key_locks import insert_keyed
from toolkit.store.tags import MAX_TAGS
from toolkit.tracing import current_traceparent


@dataclasses.dataclass(frozen=True)
class ChildTask:
    """A child task as its parent sees it.

    Attributes:
        id: the child's task id.
        name: its definition name.
        version: its definition version.
        state: its state (``queued`` ... ``cancelled``).
        result: its result once succeeded.
        error: its error once failed or cancelled (``{"name", "message", ...}``).
    """

    id: int
    name: str
    version: int
    state: str
    result: Any
    error: Mapping[str, Any] | None

    @property
    def ended(self) -> bool:
        """Whether the child is terminal."""
        return self.state in ("succeeded", "failed", "cancelled")


def child_params(definition: WorkflowDefinition) -> dict[str, Any]:
    """The parameters every statement that starts children of ``definition`` takes.

    The definition they are pinned to, their first checkpoint and deadline, their priority,
    the trace context (the parent's step span) and the tag limit.
    """
    return {
        "name": definition.name,
        "version": definition.version,
        "digest": definition.digest,
        "checkpoint": Jsonb(Checkpoint.initial(definition.start, definition.budget).to_json()),
        "timeout": definition.timeout,
        "priority": definition.priority,
        "trace_parent": current_traceparent(),
        "max_tags": MAX_TAGS,
    }


class Children:
    """Child tasks of one store."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def start(
        self,
        fence: Fence,
        occurrence: str,
        definition: WorkflowDefinition,
        child_input: Any,
        tags: Mapping[str, str] | None = None,
        concurrency: Mapping[str, Any] | None = None,
    ) -> ChildTask:
        """Start the child of ``occurrence`` unless it exists; return it.

        Args:
            fence: the parent's lease (the child gets its tenant).
            occurrence: the parent's step occurrence (e.g. ``"pay#1"``).
            definition: the child's definition (the version it is pinned to).
            child_input: the child's input, already validated against its schema.
            tags: the tags the child's definition gives it; it inherits the parent's too,
                as many as the tag limit leaves room for (its own set a key again).
            concurrency: the child's concurrency key and limit
                (:func:`~toolkit.store.submission.concurrency_params`); none by default.

        Raises:
            LeaseLost: the parent's lease is no longer held; nothing was started.
            DatabaseUnavailable: the database cannot be reached (call again: still one child).
        """
        params = {
            **fence_params(fence),
            **child_params(definition),
            "occurrence": occurrence,
            "input": Jsonb(child_input),
            "concurrency_key": None,
            "concurrency_limit": None,
            **(concurrency or {}),
            "tags": Jsonb(dict(tags or {})),
        }
        key = params["concurrency_key"]
        held = [(fence.tenant, definition.name, key)] if key is not None else []
        rows = await insert_keyed(self._db, "start_child", params, held)
        if not rows or rows[0]["parent_id"] is None:
            raise LeaseLost(f"task {fence.task_id}: lease lost before its child started")
        child = await self.get(fence.task_id, occurrence, tenant=fence.tenant)
        assert child is not None, "a child just started or found is there"
        return child

    async def get(self, parent_id: int, occurrence: str, *, tenant: str) -> ChildTask | None:
        """The child ``occurrence`` of ``parent_id`` started, or None.

        ``tenant``: the parent's (a child has its parent's tenant).
        """
        params = {"parent_id": parent_id, "occurrence": occurrence, "tenant": tenant}
        row = await self._db.fetch_one("get_child", params)
        if row is None:
            return None
        return ChildTask(
            id=row["id"],
            name=row["definition_name"],
            version=row["definition_version"],
            state=row["state"],
            result=row["result"],
            error=row["error"],
        )
