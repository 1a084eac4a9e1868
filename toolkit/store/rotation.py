"""The tenant rotation: what a claim leaves to do so that the next one reads few tenants.

A claim reads only its window: the ready, unpaused tenants of lowest vtime and those it
promoted (migration 0020; docs/decisions.md, "The fair claim at any number of tenants").
Two things then keep the rotation true, each one statement of its own after the claim
committed, neither waiting for a lock nor holding one across a round trip:

- the tenants served move on by the tasks they got per unit of weight, when the window was
  full (with fewer ready tenants than a window, every one of them is read anyway, and the
  order among them does not matter); a tenant row another statement holds is skipped, and
  what it is owed waits for the next claim (:class:`Rotation` keeps it);
- the picked tenants that had nothing due for this worker are demoted
  (``toolkit_demote_tenants``): locked, then probed in a snapshot taken after the locks; one
  with work due (another worker's, or held back by its ``max_active``) moves on as if
  served, any other leaves the rotation until its next due time.

On a store distributed by tenant (``Database.distributed``) each is a statement per tenant,
routed to the tenant's shard.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from toolkit.errors import DatabaseUnavailable, ToolkitError
from toolkit.store.database import Database

logger = logging.getLogger("toolkit.store.rotation")

#: Tenants in a claim's window per task it may claim (the window of a batch of 16: 32).
WINDOW_PER_TASK = 2
#: Due tasks the fair claim reads per tenant, and the batch its window is sized for, whatever
#: the claim's batch: it reads up to this many tasks of each tenant of its window (or the
#: tenant's share of the batch, when fewer tenants are ready than that needs), so its reads
#: grow with the square of this (512 rows for 16). A larger batch takes more of the rows
#: read (docs/tenants.md).
FAIR_READ = 16


def window(limit: int) -> int:
    """The number of ready tenants a claim of ``limit`` tasks reads at most."""
    return max(WINDOW_PER_TASK * per_tenant(limit), 2)


def per_tenant(limit: int) -> int:
    """The due tasks a fair claim of ``limit`` tasks reads per tenant at most."""
    return min(limit, FAIR_READ)


class Rotation:
    """One claimer's side of the rotation: what its claims leave to do.

    Args:
        db: the store's database.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        #: Tasks served per tenant whose vtime was not moved on yet (its row was locked).
        self._owed: Counter[str] = Counter()

    async def settle(
        self, claimed_tenants: Sequence[str], dry: Sequence[str], window_full: bool
    ) -> None:
        """Move the served tenants on (when the window was full) and demote the dry ones.

        Args:
            claimed_tenants: the tenant of each task the claim took.
            dry: the picked tenants in which it found nothing due for its worker.
            window_full: the window held as many tenants as it may.

        Never raises: the claim before it has committed and its tasks must run. A settle
        that fails is logged and left: what the served tenants are owed is kept for the next
        settle, and a tenant not demoted is probed again by a later claim. A failure because
        the database is away is logged at DEBUG only: the supervisor reports the outage once,
        as one warning (docs/operations.md).
        """
        try:
            await self._settle(claimed_tenants, dry, window_full)
        except ToolkitError as exc:
            level = logging.DEBUG if isinstance(exc, DatabaseUnavailable) else logging.WARNING
            logger.log(
                level, "the tenant rotation was not updated after a claim (the claim stands): %s",
                exc, extra={"action": "rotation_failed"},
            )  # fmt: skip

    async def _settle(
        self, claimed_tenants: Sequence[str], dry: Sequence[str], window_full: bool
    ) -> None:
        if not window_full:
            self._owed.clear()  # every ready tenant is read: the order among them is moot
        else:
            self._owed.update(claimed_tenants)
        if self._db.distributed:  # a statement per tenant, routed to its shard
            for tenant, count in list(self._owed.items()):
                if await self._db.fetch_one("advance_tenant", {"tenant": tenant, "count": count}):
                    del self._owed[tenant]
            for tenant in dry:
                await self._db.fetch_one("demote_dry_tenants", {"tenants": [tenant]})
            return
        if self._owed:
            rows = await self._db.fetch_all(
                "advance_rotation",
                {"tenants": list(self._owed), "counts": list(self._owed.values())},
            )
            for row in rows:
                del self._owed[row["tenant"]]
        if dry:
            await self._db.fetch_one("demote_dry_tenants", {"tenants": list(dry)})
