"""Retention: delete terminal tasks and their history once exported (``toolkit prune``).

The events emitted (docs/events.md) are deleted past their own retention (7 days by
default), once exported too. Throttle keys whose next start has passed hold no state and are
deleted on every prune (docs/flow-control.md).

Only terminal tasks (``succeeded``, ``failed``, ``cancelled``) that finished longer ago than
the age limit are candidates, and of those only the tasks whose whole history an export
holds, unless forced (docs/history.md, "Retention"). Deletion goes in small batches, each
one short statement that skips rows another transaction holds, so workers never wait on it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from pathlib import Path
from typing import Any

from toolkit.durations import format_duration
from toolkit.errors import ConfigError, NotExported
from toolkit.history.export import MANIFEST_NAME, read_manifest
from toolkit.store.database import Database

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 500
"""Tasks deleted per statement by default."""

DEFAULT_EVENT_RETENTION = 7 * 86400.0
"""How long the events emitted are kept by default, seconds (docs/events.md)."""


@dataclasses.dataclass(frozen=True)
class PruneReport:
    """What one prune deleted.

    Attributes:
        tasks: tasks deleted.
        events: their events deleted.
        evidence: their effect evidence records deleted.
        signals: their signals deleted.
        batches: delete statements run.
        refused: old terminal tasks left because no export holds their whole history
            (0 with ``force``).
        emitted: events emitted (``toolkit emit``) deleted, past their retention.
        throttle_keys: throttle keys deleted whose next start had passed (no state).
    """

    tasks: int = 0
    events: int = 0
    evidence: int = 0
    signals: int = 0
    batches: int = 0
    refused: int = 0
    emitted: int = 0
    throttle_keys: int = 0


async def prune(
    db: Database,
    *,
    older_than: float,
    exported_to: str | os.PathLike[str] | None = None,
    force: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    event_retention: float = DEFAULT_EVENT_RETENTION,
) -> PruneReport:
    """Delete terminal tasks that finished more than ``older_than`` seconds ago.

    A task's events, effect evidence and signals go with it. Without ``force``, every
    candidate must be exported: its creation, last update, events and evidence all inside
    the window the export runs in ``exported_to`` cover contiguously; if any candidate is
    not, nothing is deleted. A task a live child task points at is kept. Idempotent: run it
    again after an interruption.

    Args:
        db: the store's database (``store.db``).
        older_than: age limit in seconds, by database time, since the task finished.
        exported_to: the export folder that must hold the history (see `toolkit.history.export`).
        force: delete old terminal tasks whether exported or not.
        batch_size: tasks (events, throttle keys) per delete statement, each a short
            transaction.
        event_retention: age, seconds, past which the events emitted are deleted: those
            the export in ``exported_to`` holds, or all of them with ``force`` (none when
            neither).

    Returns:
        What was deleted.

    Raises:
        NotExported: some candidates are not exported (nothing deleted), or no export
            folder was given without ``force``.
        HistoryError: the manifest in ``exported_to`` cannot be read or is of another
            export schema version (a folder without one counts as nothing exported).
        ConfigError: ``older_than`` is negative or ``batch_size`` below 1.
    """
    if older_than < 0:
        raise ConfigError(f"older_than must be a duration >= 0, not {older_than}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, not {batch_size}")
    exported_from: datetime.datetime | None = None
    exported_until: datetime.datetime | None = None
    if exported_to is not None and (Path(exported_to) / MANIFEST_NAME).exists():
        start, exported_until = read_manifest(exported_to).covered
        exported_from = start or datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)

    params = {
        "older_than": older_than,
        "exported_from": exported_from,
        "exported_until": exported_until,
        "batch": batch_size,
    }
    # First pass: every candidate exported? (reads only, in id order, batch by batch)
    if not force:
        refused, after = 0, 0
        while True:
            rows = await db.fetch_all("prune_candidates", {**params, "after_id": after})
            if not rows:
                break
            refused += sum(1 for row in rows if not row["exported"])
            after = rows[-1]["id"]
        if refused:
            where = (
                f"the export in {exported_to} does not hold their whole history"
                if exported_to is not None
                else "no export folder was given"
            )
            raise NotExported(
                f"{refused} terminal tasks older than {format_duration(older_than)} are not "
                f"exported ({where}); run `toolkit export` first, give --exported-to, or --force"
            )

    totals = {"tasks": 0, "events": 0, "evidence": 0, "signals": 0}
    batches, after = 0, 0
    while True:
        rows = await db.fetch_all("prune_candidates", {**params, "after_id": after})
        if not rows:
            break
        after = rows[-1]["id"]
        by_tenant: dict[str, list[int]] = {}
        for row in rows:
            if force or row["exported"]:
                by_tenant.setdefault(row["tenant"], []).append(row["id"])
        for tenant, ids in sorted(by_tenant.items()):  # one shard each when distributed
            deleted = await db.fetch_one("prune_tasks", {"tenant": tenant, "ids": ids})
            assert deleted is not None
            batches += 1
            for key in totals:
                totals[key] += int(deleted[key])
            logger.debug(
                "pruned a batch of terminal tasks",
                extra={"action": "prune_batch", "tasks": int(deleted["tasks"]), "last_id": after},
            )
    emitted = 0
    if force or exported_until is not None:
        window = {"retention": event_retention, "batch": batch_size,
                  "exported_until": None if force else exported_until}  # fmt: skip
        count, runs = await _per_tenant(
            db, "prune_emitted_tenants", "prune_emitted", "emitted", window
        )
        emitted += count
        batches += runs
    throttle_keys, runs = await _per_tenant(
        db, "prune_throttle_tenants", "prune_throttle_keys", "throttle_keys", {"batch": batch_size}
    )
    batches += runs
    return PruneReport(batches=batches, emitted=emitted, throttle_keys=throttle_keys, **totals)


async def _per_tenant(
    db: Database, tenants: str, delete: str, column: str, params: dict[str, Any]
) -> tuple[int, int]:
    """Run the batch delete ``delete`` for each tenant ``tenants`` names, until it deletes none.

    A store distributed by tenant locks one shard's rows per statement.

    Returns:
        ``(rows deleted, statements that deleted some)``.
    """
    deleted, runs = 0, 0
    for row in await db.fetch_all(tenants, params):
        while True:
            done = await db.fetch_one(delete, {**params, "tenant": row["tenant"]})
            count = int(done[column]) if done is not None else 0
            if not count:
                break
            deleted += count
            runs += 1
    return deleted, runs
