"""Worker identity in the store: registration, refusal of a live duplicate id, stop (DESIGN §5)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.errors import WorkerIdInUse
from toolkit.store.database import Database


@dataclasses.dataclass(frozen=True)
class WorkerRecord:
    """A registered worker process."""

    worker_id: str
    pid: int
    host: str
    concurrency: int
    lease_seconds: float
    heartbeat_seconds: float
    definitions: Any
    started_at: datetime.datetime
    heartbeat_at: datetime.datetime
    expires_at: datetime.datetime
    stopped_at: datetime.datetime | None
    live: bool


class Membership:
    """The ``toolkit_workers`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def register(
        self,
        worker_id: str,
        *,
        incarnation: str,
        concurrency: int,
        definitions: Sequence[Mapping[str, Any]],
        lease_seconds: float,
        heartbeat_seconds: float,
    ) -> None:
        """Register this process under ``worker_id``; renewed by every heartbeat.

        A registration held by a process of this host that no longer exists (a crash, then a
        restart) is taken over at once; the dead process's leases are not: they are keyed by
        task and fencing token and lapse on their own.

        Args:
            worker_id: the id.
            incarnation: this process's registration, unique per process and start: the
                heartbeats and the stop are keyed by it (a process that stalled while
                another took the id over finds that out).
            concurrency: the worker's cycles at most, for operators.
            definitions: ``{"name", "version", "digest"}`` of every loaded definition.
            lease_seconds: how long the registration lives without a heartbeat.
            heartbeat_seconds: the heartbeat interval, for ``toolkit doctor``.

        Raises:
            WorkerIdInUse: another live process holds the id (its heartbeat is fresh).
        """
        params = {
            "worker_id": worker_id,
            "incarnation": incarnation,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "concurrency": concurrency,
            "definitions": Jsonb([dict(d) for d in definitions]),
            "lease_seconds": lease_seconds,
            "heartbeat_seconds": heartbeat_seconds,
            "dead_pid": None,
        }
        row = await self._db.fetch_one("register_worker", params)
        if row is None:
            holder = await self._db.fetch_one("get_worker", {"worker_id": worker_id})
            if (
                holder is not None
                and holder["host"] == params["host"]
                and not _alive(holder["pid"])
            ):
                row = await self._db.fetch_one(
                    "register_worker", {**params, "dead_pid": holder["pid"]}
                )
        if row is None:
            raise WorkerIdInUse(
                f"worker id {worker_id!r} is held by another live process; "
                "give each worker its own --worker-id, or stop that process"
            )

    async def stop(self, worker_id: str, incarnation: str) -> None:
        """Record this registration stopped (not one that took the id over since)."""
        await self._db.execute(
            "stop_worker", {"worker_id": worker_id, "incarnation": incarnation}
        )

    async def list(self) -> list[WorkerRecord]:
        """Live workers first, then recently stopped ones."""
        return [WorkerRecord(**row) for row in await self._db.fetch_all("list_workers")]

    async def fleet_counts(self, every: float) -> FleetCounts:
        """The fleet gauges' counts, counted again if the stored ones are ``every`` s old.

        Counted by this worker if no other does it first (migration 0022): each count reads
        every live task, so one worker of the fleet counts per interval and the others read
        what it stored.
        """
        row = await self._db.fetch_one("refresh_fleet_counts", {"every": every})
        if row is None:
            row = await self._db.fetch_one("fleet_counts")
            assert row is not None, "migration 0022 inserts the row"
        return FleetCounts(
            unavailable={
                (r["definition_name"], r["definition_version"]): r["n"] for r in row["unavailable"]
            },
            held={(r["definition_name"], r["reason"]): r["n"] for r in row["held"]},
        )


@dataclasses.dataclass(frozen=True)
class FleetCounts:
    """The fleet gauges' counts, as one worker of the fleet last counted them.

    The gauges ``toolkit_definition_unavailable_tasks`` and ``toolkit_tasks_held``.

    Attributes:
        unavailable: live tasks per (definition name, version) that no live worker has loaded.
        held: live tasks held back now per (definition name, reason); see `TaskReads.held`.
    """

    unavailable: dict[tuple[str, int], int]
    held: dict[tuple[str, str], int]


def _alive(pid: int) -> bool:
    """True if a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
