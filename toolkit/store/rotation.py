"""The tenant rotation: what a claim leaves to do so that the next one reads few tenants.

A claim reads only its window: the ready, unpaused tenants of lowest vtime and those it
promoted (migration 0020; docs/decisions.md, "The fair claim at any number of tenants").
Two things then keep the rotation true, each in a short transaction of its own after the
claim committed (so that it holds no task lock while it waits for a tenant row):

- the tenants served move on by the tasks they got per unit of weight, when the window was
  full (with fewer ready tenants than a window, every one of them is read anyway, and the
  order among them does not matter);
- the picked tenants that had nothing due for this worker are demoted: locked, then probed
  in a snapshot taken after the locks; one with work due (another worker's, or held back
  by its ``max_active``) moves on as if served, any other leaves the rotation until its
  next due time.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from toolkit.errors import ToolkitError
from toolkit.store.database import Database

logger = logging.getLogger("toolkit.store.rotation")

#: Tenants in a claim's window per task it may claim (the window of a batch of 16: 32).
WINDOW_PER_TASK = 2


def window(limit: int) -> int:
    """The number of ready tenants a claim of ``limit`` tasks reads at most."""
    return max(WINDOW_PER_TASK * limit, 2)


async def settle(
    db: Database, claimed_tenants: Sequence[str], dry: Sequence[str], window_full: bool
) -> None:
    """Move the served tenants on (when the window was full) and demote the dry ones.

    Args:
        db: the store's database.
        claimed_tenants: the tenant of each task the claim took.
        dry: the picked tenants in which it found nothing due for its worker.
        window_full: the window held as many tenants as it may.

    Never raises: the claim before it has committed and its tasks must run. A settle that
    fails (the database away, a statement rolled back) is logged and left: a tenant not
    moved on is served a little early, one not demoted is probed again by a later claim.
    """
    try:
        await _settle(db, claimed_tenants, dry, window_full)
    except ToolkitError as exc:
        logger.warning(
            "the tenant rotation was not updated after a claim (the claim stands): %s", exc,
            extra={"action": "rotation_failed"},
        )


async def _settle(
    db: Database, claimed_tenants: Sequence[str], dry: Sequence[str], window_full: bool
) -> None:
    if window_full and claimed_tenants:
        served = Counter(claimed_tenants)
        await db.execute(
            "advance_rotation", {"tenants": list(served), "counts": list(served.values())}
        )
    if dry:
        await db.fetch_all_then(
            "lock_dry_tenants",
            {"tenants": list(dry)},
            lambda rows: (
                ("demote_dry_tenants", {"tenants": [row["tenant"] for row in rows]})
                if rows
                else None
            ),
        )
