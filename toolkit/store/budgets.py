"""Budget reservations in the store: taken atomically from a task's tenant (DESIGN §2-3).

A parallel or map step that declares ``reserve`` takes its reservation before any branch
starts. The task's own budget lives in its checkpoint (only the lease holder changes it);
the tenant's lives in ``toolkit_tenant_budgets`` (``used`` counts spent plus reserved,
``reserved`` the reserved part) and is shared by every task of the tenant, so a reservation
locks the tenant's rows, checks and takes them, and writes the checkpoint recording it, in
one transaction fenced by the lease: concurrent reservations by many workers never
over-commit a budget, and a reservation is never taken without the checkpoint that will
release it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.errors import LeaseLost
from toolkit.store.database import Database
from toolkit.store.fence import Fence, fence_params
from toolkit.store.queries import query


class ReservationOutcome(enum.StrEnum):
    """What became of a reservation."""

    RESERVED = "reserved"
    #: It does not fit now: try again later (another task may release budget).
    LATER = "later"
    #: It can never fit: what the tenant's budget for a resource has not spent for good
    #: (its amount less its use, its reservations returned) is smaller.
    NEVER = "never"


class Budgets:
    """Tenant budget reservations of one store."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def reserve(
        self,
        fence: Fence,
        amounts: Mapping[str, float],
        checkpoint: Mapping[str, Any],
        write_id: str,
        detail: Mapping[str, Any],
    ) -> tuple[ReservationOutcome, str | None]:
        """Take ``amounts`` from the tenant's budgets and store ``checkpoint``, or neither.

        Resources the tenant has no budget row for are not limited at the tenant level.

        Args:
            fence: the lease of the task reserving (its tenant's budgets are used).
            amounts: resource to amount (≥ 0).
            checkpoint: the checkpoint recording the reservation (stored only if it is
                taken), JSON.
            write_id: the write's id (see `toolkit.store.leases.FencedWrite`): sent again after a
                lost connection, a reservation already taken is reported taken.
            detail: the detail of the ``budget_reserved`` event.

        Returns:
            The outcome, and for LATER / NEVER the resource that does not fit.

        Raises:
            LeaseLost: the lease is no longer held; nothing was taken.
            DatabaseUnavailable: the database cannot be reached (then nothing was taken, or
                it was with this ``write_id``: call again).
        """
        async with self._db.transaction() as conn:
            cursor = await conn.execute(query("lock_leased_task"), fence_params(fence))
            row = await cursor.fetchone()
            if row is None:
                raise LeaseLost(f"task {fence.task_id}: lease lost before its budget reservation")
            if row[1] == write_id:
                return ReservationOutcome.RESERVED, None
            cursor = await conn.execute(
                query("lock_tenant_budgets"),
                {"tenant": fence.tenant, "resources": sorted(amounts)},
            )
            rows = await cursor.fetchall()
            for resource, amount, used, reserved in rows:  # never, on any resource, first
                if float(amounts[resource]) > amount - (used - reserved) + 1e-9:
                    return ReservationOutcome.NEVER, resource
            for resource, amount, used, _ in rows:
                if float(amounts[resource]) > amount - used + 1e-9:
                    return ReservationOutcome.LATER, resource
            await conn.execute(
                query("take_tenant_budgets"),
                {"tenant": fence.tenant, "amounts": Jsonb(dict(amounts))},
            )
            cursor = await conn.execute(
                query("write_reservation"),
                {
                    **fence_params(fence),
                    "checkpoint": Jsonb(checkpoint),
                    "write_id": write_id,
                    "detail": Jsonb(detail),
                },
            )
            if await cursor.fetchone() is None:  # expired since the lock: roll it all back
                raise LeaseLost(f"task {fence.task_id}: lease lost during its budget reservation")
        return ReservationOutcome.RESERVED, None
