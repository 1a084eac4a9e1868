"""Branch rows: the state of each branch of a parallel or map step, one row per branch.

A branch's progress is written by the task's fenced writes (``FencedWrite.branches``); this
module reads it back: the branches a resumed cycle runs (not the parked ones), every branch
once the step ends, and what ``toolkit show`` lists (docs/composition.md, migration 0012).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any

from toolkit.store.database import Database
from toolkit.store.task_tenants import task_tenant

#: A step occurrence in a branch row's path (``each#1/``): what its address leaves out
#: (the same rule as the SQL of ``signal_waiters``).
_OCCURRENCE_PART = re.compile(r"[^/]*#[0-9]+/")


@dataclasses.dataclass(frozen=True)
class StoredBranch:
    """One stored branch.

    Attributes:
        name: the branch's name, or a map item's index as text.
        position: its order among the step's branches.
        status: where it stands (``running``, ``waiting``, ``succeeded`` ...).
        frame: its progress (``BranchFrame`` JSON).
        wakes: wakes it has had (a signal, completion or child end for its wait).
        seen: the wakes a resumed cycle recorded handled.
        due: a waiting branch whose timer has passed.
        fanout: the step occurrence it belongs to.
        run_at: a waiting branch's timer (database time); None for none.
        waits_for: what a waiting branch waits for (``signal:NAME`` ...).
    """

    name: str
    position: int
    status: str
    frame: dict[str, Any]
    wakes: int = 0
    seen: int = 0
    due: bool = False
    fanout: str = ""
    run_at: datetime.datetime | None = None
    waits_for: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        """Its signal address (a row read with its step occurrence, ``of_task``).

        Its name; in a nested parallel or map step, the names of the branches holding it
        and its own, joined by ``/`` (``3/approval``).
        """
        return _OCCURRENCE_PART.sub("", f"{self.fanout}/{self.name}") if self.fanout else self.name


@dataclasses.dataclass(frozen=True)
class SignalWaiter:
    """A waiting branch that waits for a signal.

    Attributes:
        address: its signal address (``approval``, ``3/approval``).
        fanout: its step occurrence (``each#1/3/checks#1``).
        name: its name.
        cursor: the step it waits at.
    """

    address: str
    fanout: str
    name: str
    cursor: str | None


class BranchRows:
    """Reads of the branch rows of one store."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def resumable(self, task_id: int, fanout: str, *, tenant: str) -> list[StoredBranch]:
        """The branches of ``fanout`` a resumed cycle runs: running, blocked, or woken/due.

        Args:
            task_id: the task.
            fanout: the parallel or map step occurrence (``"fan#1"``).
            tenant: the task's tenant (from its claim).
        """
        params = {"task_id": task_id, "tenant": tenant, "fanout": fanout}
        rows = await self._db.fetch_all("resumable_branches", params)
        return [
            StoredBranch(
                r["name"], r["position"], r["status"], r["frame"], r["wakes"], r["seen"], r["due"]
            )
            for r in rows
        ]

    async def ended(self, task_id: int, fanout: str, *, tenant: str) -> list[StoredBranch]:
        """Every branch of ``fanout``, in position order (read when the step ends).

        ``tenant``: the task's.
        """
        params = {"task_id": task_id, "tenant": tenant, "fanout": fanout}
        rows = await self._db.fetch_all("ended_branches", params)
        return [StoredBranch(r["name"], r["position"], r["status"], r["frame"]) for r in rows]

    async def waiting(self, task_id: int, fanout: str, *, tenant: str) -> list[StoredBranch]:
        """The waiting branches of ``fanout``, in position order (``tenant``: the task's)."""
        params = {"task_id": task_id, "tenant": tenant, "fanout": fanout}
        rows = await self._db.fetch_all("waiting_branches", params)
        return [
            StoredBranch(r["name"], r["position"], "waiting", r["frame"], r["wakes"]) for r in rows
        ]

    async def of_task(
        self, task_id: int, limit: int = 200, *, tenant: str | None = None
    ) -> list[StoredBranch]:
        """A task's stored branches (at most ``limit``), by step occurrence and position.

        ``tenant``: the task's, if known; else looked up by the id
        (:func:`~toolkit.store.task_tenants.task_tenant`).
        """
        tenant = await task_tenant(self._db, task_id, tenant)
        params = {"task_id": task_id, "tenant": tenant, "limit": limit}
        rows = await self._db.fetch_all("task_branches", params)
        branches = []
        for r in rows:
            branch = StoredBranch(
                r["name"], r["position"], r["status"], r["frame"], fanout=r["fanout"],
                run_at=r["run_at"], waits_for=tuple(r["waits_for"]),
            )  # fmt: skip
            branches.append(branch)
        return branches

    async def signal_waiters(self, task_id: int, name: str, *, tenant: str) -> list[SignalWaiter]:
        """The task's waiting branches that wait for signal ``name`` (up to 20).

        ``tenant``: the task's.
        """
        params = {"task_id": task_id, "tenant": tenant, "name": name}
        rows = await self._db.fetch_all("signal_waiters", params)
        return [SignalWaiter(r["address"], r["fanout"], r["name"], r["cursor"]) for r in rows]
