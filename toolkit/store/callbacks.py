"""Callback tokens in the store: an effect completed from outside (``callback`` steps).

An effect with ``callback`` hands its handler a token (``ctx.callback_token``), one per step
occurrence and attempt, registered before the handler runs. ``toolkit complete TOKEN``
(`Callbacks.complete`) records the outcome once and wakes the task; the task then waits
without a lease until the completion or the callback's timeout. A completion that arrives
before the handler returns is kept. Unknown, used or expired tokens are refused.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.errors import CallbackRefused, LeaseLost
from toolkit.lifecycle import TaskState
from toolkit.store.database import Database
from toolkit.store.fence import Fence, fence_params


@dataclasses.dataclass(frozen=True)
class CallbackRecord:
    """A callback token and what became of it.

    Attributes:
        token: the token.
        task_id: its task.
        occurrence: the step occurrence that handed it out.
        attempt: the attempt that handed it out.
        state: ``open``, ``completed`` or ``expired``.
        result: the completion's result (completed without error).
        error: the completion's error ``{"name", "message"}``, or None.
        task_state: the state of its task.
    """

    token: str
    task_id: int
    occurrence: str
    attempt: int
    state: str
    result: Any
    error: dict[str, Any] | None
    task_state: str


def new_token() -> str:
    """A fresh, unguessable callback token."""
    return "cb_" + secrets.token_urlsafe(18)


def wake_branches_of(
    keys: list[tuple[int, str, str | None]], tenant: str | None
) -> tuple[str, dict[str, Any]] | None:
    """The ``wake_branches`` statement for ``(task id, key, address)`` triples, or None.

    ``key``: what a waiting branch waits for (``signal:NAME``, ``callback:TOKEN``);
    ``address``: the branch a signal is for, or None; ``tenant``: the tasks' tenant when
    they have one (the rotation's marks name it: due_marks), None for several.
    """
    if not keys:
        return None
    rows = [{"task_id": task_id, "key": key, "address": address} for task_id, key, address in keys]
    return "wake_branches", {"keys": Jsonb(rows), "tenant": tenant}


class Callbacks:
    """Callback tokens of one store."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, fence: Fence, occurrence: str, attempt: int, token: str) -> None:
        """Register callback ``token`` for an attempt (fenced); expire earlier attempts' tokens.

        Raises:
            LeaseLost: the lease is no longer held; nothing was registered.
        """
        row = await self._db.fetch_one(
            "create_callback",
            {
                **fence_params(fence), "occurrence": occurrence, "attempt": attempt,
                "callback_token": token,
            },
        )  # fmt: skip
        if row is None or row["task_id"] is None:
            raise LeaseLost(
                f"task {fence.task_id}: lease lost before its callback was registered"
            )

    async def get(self, token: str, *, tenant: str | None = None) -> CallbackRecord | None:
        """The callback ``token``, or None when there is no such token.

        ``tenant``: its task's, if known (a worker's); else looked up by the token.
        """
        params = {"callback_token": token, "tenant": await self._tenant(token, tenant)}
        row = await self._db.fetch_one("get_callback", params)
        if row is None:
            return None
        return CallbackRecord(
            token=row["token"], task_id=row["task_id"], occurrence=row["occurrence"],
            attempt=row["attempt"], state=row["state"], result=row["result"],
            error=row["error"], task_state=row["task_state"],
        )  # fmt: skip

    async def complete(
        self, token: str, *, result: Any = None, error: dict[str, Any] | None = None
    ) -> int:
        """Record the outcome of callback ``token``, once; wake its task.

        Args:
            token: the token the handler handed out.
            result: the step's result (JSON), when it succeeded.
            error: ``{"name", "message"}`` when it failed: it goes through the step's retry
                and catch like a handler's error.

        Returns:
            The task id.

        Raises:
            CallbackRefused: no such token, it was completed or expired already, or its
                task has ended.
        """
        tenant = await self._tenant(token, None)
        if tenant is None:
            raise CallbackRefused(f"no callback token {token!r}")
        rows = await self._db.fetch_all_then(
            "complete_callback",
            {
                "callback_token": token,
                "tenant": tenant,
                "result": None if error is not None else Jsonb(result),
                "error": None if error is None else Jsonb(error),
            },
            lambda done: wake_branches_of(
                [(row["task_id"], f"callback:{token}", None) for row in done], tenant
            ),
        )
        if rows:
            return int(rows[0]["task_id"])
        known = await self.get(token, tenant=tenant)
        if known is None:
            raise CallbackRefused(f"no callback token {token!r}")
        if known.state == "open":  # its task has ended
            raise CallbackRefused(
                f"task {known.task_id} of callback {token!r} "
                f"{TaskState(known.task_state).phrase()}: the callback can no longer be completed"
            )
        why = "was completed already" if known.state == "completed" else (
            "expired (its attempt timed out or was retried)")
        raise CallbackRefused(f"callback {token!r} of task {known.task_id} {why}")

    async def expire(self, token: str, *, tenant: str) -> None:
        """Refuse any later completion of ``token`` (its attempt timed out).

        ``tenant``: its task's.
        """
        await self._db.execute("expire_callback", {"callback_token": token, "tenant": tenant})

    async def _tenant(self, token: str, tenant: str | None) -> str | None:
        """``tenant`` when given, else the tenant of callback ``token`` (None: no such token).

        A lookup by the token alone reads every node of a store distributed by tenant
        (docs/scaling.md), as a lookup of a task by its id does.
        """
        if tenant is not None:
            return tenant
        row = await self._db.fetch_one("callback_tenant", {"callback_token": token})
        return None if row is None else str(row["tenant"])
