"""Leases: claim, heartbeat, and the fenced write of a leased task (DESIGN §2, §4).

Every state-changing write carries its lease's fence (worker id, task, tenant, token) and is
applied only while that lease is held and unexpired, in the same statement
(``toolkit_lease_held``); otherwise it changes nothing and the caller gets
:class:`~toolkit.errors.LeaseLost`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from toolkit.errors import LeaseLost
from toolkit.lifecycle import TERMINAL_STATES, TaskState, WaitReason
from toolkit.payload import PayloadLimits
from toolkit.store import rotation
from toolkit.store.database import Database
from toolkit.store.descendants import ended_children
from toolkit.store.distributed_leases import (
    admit_keys_per_tenant,
    claim_per_tenant,
    record_on_shard,
    renew_per_tenant,
    wake_other_tenants,
)
from toolkit.store.distribution import is_distributed
from toolkit.store.fence import Fence
from toolkit.store.queries import query
from toolkit.store.writes import FencedWrite, writes_param

#: Waits that something sent from outside ends (a signal, a callback completion): the commit
#: of such a wait looks for what was sent while it queued for the task's row (see
#: :meth:`Leases.commit_many`).
_RACED = frozenset({WaitReason.SIGNAL, WaitReason.CALLBACK})


@dataclasses.dataclass(frozen=True)
class Renewal:
    """What a heartbeat renewed.

    Attributes:
        renewed: task id to its cancel request (``{"reason", "at"}``) or None, for every
            lease renewed.
        registered: the worker's registration is still this process's; False once another
            process took its worker id over (its leases, which expire with it, are gone).
        ended: leases not renewed because this process's own last write under them ended
            them (the task queued, waiting or ended with the lease's token): not lost.
    """

    renewed: dict[int, Any]
    registered: bool
    ended: frozenset[int] = frozenset()


@dataclasses.dataclass(slots=True)
class ClaimedTask:
    """A task this worker now leases.

    Not changed once claimed, though not frozen (as a `toolkit.store.writes.EvidenceRecord`).

    Attributes:
        id: task id.
        tenant: task tenant.
        digest: the definition digest the task is pinned to.
        input: the task input (JSON).
        checkpoint: the stored checkpoint (JSON).
        token: the fencing token of this lease.
        attempts: claims of this task so far, this one included.
        recovered: the previous lease expired while held (a takeover).
        queue_delay: seconds from ``run_at`` to this claim, in database time.
        cancel_requested: the cancel request (``{"reason", "at"}``) if one is pending.
        deadline_in: seconds left until the workflow deadline (≤ 0: passed), database time;
            None when the task has none.
        tags: the task's tags when claimed.
        child: the task is a child (a ``workflow`` step started it).
        trace_parent: the W3C traceparent the task was submitted under (None: untraced).
        trace_attempt: the traceparent of the span of its previous attempt, if traced.
        deferred_before: a takeover of a lease whose holder had a checkpoint window: it may
            have run past the stored cursor (migration 0027).
    """

    id: int
    tenant: str
    digest: str
    input: Any
    checkpoint: dict[str, Any]
    token: int
    attempts: int
    recovered: bool
    queue_delay: float
    cancel_requested: Any = None
    deadline_in: float | None = None
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    child: bool = False
    trace_parent: str | None = None
    trace_attempt: str | None = None
    deferred_before: bool = False

    def fence(self, worker_id: str) -> Fence:
        """The fence of this lease, held by ``worker_id``."""
        return Fence(worker_id, self.id, self.tenant, self.token)


#: The statements that wake the branches a group commit parked, in its transaction: one on
#: one PostgreSQL; on a store distributed by tenant, four, each routed to the tenant's shard
#: (``wake_waiting_branches`` in writes.sql says why).
_BRANCH_WAKES: dict[bool, tuple[str, ...]] = {
    False: ("wake_waiting_branches",),
    True: (
        "wake_parked_on_signal",
        "wake_parked_on_callback",
        "wake_parked_on_child",
        "make_branch_waiters_due",
    ),
}


def _lean(write: FencedWrite) -> bool:
    """Whether ``write`` may go by ``commit_step`` (writes.sql says why it leaves out the rest).

    It keeps its lease or ends its task, and carries nothing but a checkpoint, a result or
    error, evidence that releases no downstream-limit slot, events, tags and branch rows.
    (An end that does more than its task's row is referred back by the statement.)
    """
    return (
        (write.state == TaskState.LEASED or write.state in TERMINAL_STATES)
        and not write.branches_ended and not write.signals
        and not write.budget_delta and not write.budget_released
        and not any(record.releases_slots for record in write.evidence)
    )  # fmt: skip


class Leases:
    """Claims, heartbeats and fenced writes of one store."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # Whether tenants with a max_active exist, as the last claim saw it: while they do,
        # a claim locks them first (see :meth:`claim`). Starts True: the first claim finds out.
        self._limits = True
        # The only unpaused tenant, as the last claim saw it (None: there are several, or
        # unknown): claims then read its index range alone.
        self._one_tenant: str | None = None
        # Whether tasks may wait for a concurrency key that has room, as the last claim saw
        # it: a claim then admits them first (see :meth:`admit_keys`). Starts True.
        self._key_wakes = True
        # Whether one unpaused tenant is all there is, as the last claim saw it.
        self._alone = False
        self._rotation = rotation.Rotation(db)

    @property
    def database(self) -> Database:
        """The database these leases live in."""
        return self._db

    @property
    def payload_limits(self) -> PayloadLimits:
        """The size and nesting limits of stored JSON values (the database's)."""
        return self._db.payload_limits

    async def claim(
        self,
        worker_id: str,
        digests: Sequence[str],
        limit: int,
        lease_seconds: float,
        *,
        deferring: bool = False,
    ) -> list[ClaimedTask]:
        """Claim up to ``limit`` due tasks of the given definitions, fairly across tenants.

        Due means queued or waiting with ``run_at`` reached, or leased with an expired lease
        (recoverable). Each claim raises the task's fencing token by one. Tenant admission
        (docs/tenants.md): paused tenants are skipped; the batch goes to the tenants with the
        fewest leased tasks per unit of weight; a tenant never holds more unexpired leases
        than its ``max_active``, however many workers claim at once.

        While no tenant has a ``max_active``, a claim is one statement. Otherwise it is a
        short transaction: lock the limited tenants no other claimer holds (the others are
        skipped this round), then claim, counting their leases in a snapshot taken after the
        locks. While one unpaused tenant is all there is, the claim reads that tenant's
        index range alone (nothing to share); each claim reports whether that still holds.
        Tasks waiting for a concurrency key that may have room are admitted first (see
        :meth:`admit_keys`), and again after a claim that found nothing due.

        Args:
            worker_id: the claiming worker's id.
            digests: definition digests this worker has loaded; no other task is claimed.
            limit: most tasks to claim.
            lease_seconds: lease duration, seconds, from database now.
            deferring: the claimer runs with a checkpoint window (a takeover of its lease
                then learns it: ``ClaimedTask.deferred_before``).

        Returns:
            The claimed tasks, in id order (possibly none).

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        if limit <= 0 or not digests:
            return []
        params = {
            "worker_id": worker_id,
            "digests": list(digests),
            "limit": limit,
            "lease_seconds": lease_seconds,
            "deferring": deferring,
            "locked": [],
            "window": rotation.window(limit),
            "per_tenant": rotation.per_tenant(limit),
            "tenant": None,  # every tenant (a claim for one names it: due_tasks)
        }
        admitted = await self.admit_keys() if self._key_wakes else 0
        rows = await self._claim_rows(params)
        if not rows and not admitted and await self.admit_keys():
            rows = await self._claim_rows(params)  # nothing due, but a key had room
        return [
            ClaimedTask(
                id=row["id"],
                tenant=row["tenant"],
                digest=row["definition_digest"],
                input=row["input"],
                checkpoint=row["checkpoint"],
                token=row["lease_token"],
                attempts=row["attempts"],
                recovered=row["recovered"],
                queue_delay=row["queue_delay"],
                cancel_requested=row["cancel_requested"],
                deadline_in=row["deadline_in"],
                tags=row["tags"],
                child=row["child"],
                trace_parent=row["trace_parent"],
                trace_attempt=row["trace_attempt"],
                deferred_before=row["deferred_before"],
            )
            for row in rows
        ]

    async def admit_keys(self) -> int:
        """Admit tasks waiting for a concurrency key that has room (docs/flow-control.md).

        Each key is decided under its own lock, in submission order, up to the
        ``max_active`` its oldest waiting task was submitted with; at most 256 keys per
        call (the next claim goes on while more are left).

        Returns:
            How many tasks were admitted (each is queued, or waits for its delayed start).

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        if await is_distributed(self._db):
            admitted, self._key_wakes = await admit_keys_per_tenant(self._db, 256)
            return admitted
        row = await self._db.fetch_one("admit_keys", {"max_keys": 256})
        assert row is not None
        self._key_wakes = bool(row["remaining"])
        return int(row["admitted"])

    async def _claim_rows(self, params: dict[str, Any]) -> list[Any]:
        """The claim statement(s): the one tenant's range while it is alone, else fair.

        Returns the rows of the tasks claimed; notes what the claim's summary says. On a
        store distributed by tenant, tenant by tenant (``toolkit.store.distributed_leases``).
        """
        if await is_distributed(self._db):
            rows, summary = await claim_per_tenant(self._db, params)
            self._key_wakes = bool(summary["key_wakes"])
            await self._rotation.settle(
                [row["tenant"] for row in rows], summary["dry"], summary["window_full"]
            )
            return rows
        claimed: list[Any] = []
        if self._one_tenant is not None:
            claimed = self._summarised(await self._db.fetch_all(
                "claim_tasks_one_tenant", {**params, "tenant": self._one_tenant},
                plan_once=True,
            ))  # fmt: skip
            if not claimed:
                self._one_tenant = None  # not alone any more, or nothing due: the fair claim
        if not claimed:
            claimed = await self._fair_claim(params)
        if claimed and self._alone:
            self._one_tenant = claimed[0]["tenant"]
        return claimed

    async def _fair_claim(self, params: dict[str, Any]) -> list[Any]:
        """The claim across tenants: one statement, or locking the limited tenants first.

        Then what it leaves the rotation to do (:meth:`toolkit.store.rotation.Rotation.settle`).
        """
        if not self._limits:
            rows = await self._db.fetch_all("claim_tasks", params, plan_once=True)
        else:
            async with self._db.transaction() as conn:
                cursor = conn.cursor(row_factory=dict_row)
                await cursor.execute(query("lock_limited_tenants"), params)
                params["locked"] = [row["tenant"] for row in await cursor.fetchall()]
                await cursor.execute(query("claim_tasks"), params)
                rows = await cursor.fetchall()
        claimed = self._summarised(rows)
        summary = rows[0]
        await self._rotation.settle(
            [row["tenant"] for row in claimed], summary["dry"], summary["window_full"]
        )
        return claimed

    def _summarised(self, rows: list[Any]) -> list[Any]:
        """Note what a claim's summary says (every row carries it); its claimed rows."""
        summary = rows[0]
        self._limits = bool(summary["limits"])
        self._key_wakes = bool(summary["key_wakes"])
        self._alone = summary["tenants"] == 1 and not self._limits
        return [row for row in rows if row["id"] is not None]

    async def renew(
        self, worker_id: str, incarnation: str, fences: Sequence[Fence], lease_seconds: float
    ) -> Renewal:
        """Extend the registration and every lease of ``fences`` in one statement (heartbeat).

        Args:
            worker_id: the holder (it renews its registration too, with no lease held).
            incarnation: the holder's registration (see ``Membership.register``).
            fences: every lease the process holds, all held by ``worker_id``.
            lease_seconds: new lease duration from database now, seconds.

        Returns:
            The leases renewed, those this process's own writes ended meanwhile (any other
            of ``fences`` has lost its lease), and whether the registration is still this
            process's.

        Runs on the database's reserved connection, so handlers holding every connection of
        the main pool do not starve it. Idempotent: safe to send again.

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        params = {
            "worker_id": worker_id, "incarnation": incarnation, "lease_seconds": lease_seconds
        }  # fmt: skip
        if await is_distributed(self._db):
            registered, rows = await renew_per_tenant(self._db, params, fences)
        else:
            rows = await self._db.fetch_all(
                "renew_leases",
                {
                    **params,
                    "task_ids": [fence.task_id for fence in fences],
                    "tenants": [fence.tenant for fence in fences],
                    "tokens": [fence.token for fence in fences],
                    "tenant": None,
                },
                reserved=True,
            )
            registered = bool(rows and rows[0]["registered"])
        return Renewal(
            renewed={
                row["id"]: row["cancel_requested"]
                for row in rows
                if row["id"] is not None and not row["ended"]
            },
            registered=registered,
            ended=frozenset(row["id"] for row in rows if row["id"] is not None and row["ended"]),
        )

    async def commit(self, write: FencedWrite) -> TaskState:
        """Apply one fenced write: checkpoint, evidence, events and next state, atomically.

        Returns:
            The state applied: ``write.state``, or ``cancelled`` when the task had a cancel
            request and the write would have left it queued or waiting.

        Raises:
            LeaseLost: the lease of ``write.fence`` is no longer held or has expired;
                nothing was written.
            DatabaseUnavailable: the database cannot be reached (the write may or may not
                have committed; the fence makes a retry safe, and a write with a
                ``write_id`` is applied at most once).
        """
        applied = await self.commit_many([write])
        if write.fence.task_id not in applied:
            raise LeaseLost(task_id=write.fence.task_id, token=write.fence.token)
        return applied[write.fence.task_id]

    async def commit_many(self, writes: Sequence[FencedWrite]) -> dict[int, TaskState]:
        """Apply fenced writes of several tasks in one statement (group commit).

        Each write is fenced on its own: one whose lease is lost changes nothing, the others
        apply. All applied writes commit together (on a store distributed by tenant, those of
        each tenant together, one statement per tenant: docs/scaling.md). A batch with
        signal or callback waits is one transaction of two statements: the second makes such
        a wait due when what it waits for was sent while the first queued for the task's row
        (the sender then saw the task leased, and the first statement's snapshot predates
        the send); so a wait and its wake-up commit together or not at all. A write whose
        ``write_id`` is already stored (it was applied by an earlier send) is reported with
        the task's state and applied again never.

        Args:
            writes: at most one write per task, all by one worker (each with its fence).

        Returns:
            Task id to applied state, for every write that applied; a missing id is a lost
            lease.

        Raises:
            DatabaseUnavailable: the database cannot be reached (nothing or everything of
                the batch committed; the fence makes a retry safe).
            StoreError: the database refused the batch (e.g. a value it cannot store);
                nothing of the batch was written.
        """
        tenants = sorted({write.fence.tenant for write in writes})
        distributed = await is_distributed(self._db)
        if len(tenants) > 1 and distributed:
            applied: dict[int, TaskState] = {}
            for each in tenants:  # a transaction per tenant, on the tenant's node
                applied |= await self.commit_many(
                    [write for write in writes if write.fence.tenant == each]
                )
            return applied
        (worker_id,) = {write.fence.worker_id for write in writes}
        tenant = tenants[0] if len(tenants) == 1 else None
        params: dict[str, Any] = {
            "worker_id": worker_id,
            # the tenant whose rows the statement touches, to route it on a distributed
            # store; null on one server, where a released limit slot may make a task of any
            # tenant due, and the rotation's marks (due_marks) must cover that tenant too
            "tenant": tenant if distributed else None,
            # a released limit slot wakes waiting tasks of any tenant, or on a distributed
            # store of this batch's alone (its statement is routed to the tenant's shard)
            "wake_within": tenant if distributed else None,
        }
        waits = [
            w.fence.task_id
            for w in writes
            if w.state == TaskState.WAITING and w.wait_reason in _RACED
        ]
        parking = [
            w for w in writes
            if w.wait_reason == WaitReason.BRANCHES
            or any(row.status == "waiting" for row in w.branches)
        ]  # fmt: skip
        ending = [w.fence.task_id for w in writes if w.ends_child]
        hot = not waits and not parking and not ending and not distributed  # the hot path
        if hot and all(map(_lean, writes)):
            lean = {**params, "writes": writes_param(writes, lean=True)}
            rows = await self._db.fetch_all("commit_step", lean, plan_once=True)
            # with an end referred back (one that does more than its task's row) nothing of
            # the batch was applied: it goes whole by commit_fenced
            if not any(row["referred"] for row in rows):
                return {row["id"]: TaskState(row["state"]) for row in rows}
        params["writes"] = writes_param(writes)
        if hot:
            rows = await self._db.fetch_all("commit_fenced", params, plan_once=True)
            return {row["id"]: TaskState(row["state"]) for row in rows}
        unwoken: dict[str, int] = {}
        async with self._db.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            if distributed:
                on_shard = await record_on_shard(cursor, writes, params)
                applied, unwoken = on_shard.applied, on_shard.limits_unwoken
            else:
                await cursor.execute(query("commit_fenced"), params)
                applied = {row["id"]: TaskState(row["state"]) for row in await cursor.fetchall()}
            raced = [task_id for task_id in waits if applied.get(task_id) == "waiting"]
            if raced:
                await cursor.execute(
                    query("wake_raced_waits"), {"task_ids": raced, "tenant": tenant}
                )
            parking = [w for w in parking if w.fence.task_id in applied]
            if parking:
                parked = [
                    {"task_id": w.fence.task_id, "fanout": row.fanout, "name": row.name}
                    for w in parking
                    for row in w.branches
                    if row.status == "waiting"
                ]
                branch_wake = {
                    "task_ids": [w.fence.task_id for w in parking],
                    "parked": Jsonb(parked),
                    "tenant": tenant,
                }
                for statement in _BRANCH_WAKES[distributed]:
                    await cursor.execute(query(statement), branch_wake)
            ended = [task_id for task_id in ending if task_id in applied]
            if ended:
                wake = ended_children(ended, tenant)
                assert wake is not None
                await cursor.execute(query(wake[0]), wake[1])
        if unwoken:  # after the commit: a task made due finds its slot free
            assert tenant is not None
            await wake_other_tenants(self._db, tenant, unwoken)
        return applied

    async def next_signal(
        self,
        task_id: int,
        names: Sequence[str],
        taken: Sequence[int] = (),
        address: str | None = None,
        *,
        tenant: str,
    ) -> tuple[int, str, Any] | None:
        """The oldest unconsumed signal of the task named one of ``names``.

        Args:
            task_id: the task.
            names: the signal names.
            taken: ids already taken by this cycle but not yet marked consumed.
            address: for a wait inside a branch, the branch's name (signals addressed to
                it count too); None at the task's own level (task-wide signals only).
            tenant: the task's (from its claim).

        Returns:
            ``(signal id, name, payload)``, or None.
        """
        row = await self._db.fetch_one(
            "next_signal",
            {"task_id": task_id, "tenant": tenant, "names": list(names), "taken": list(taken),
             "address": address},
        )
        return None if row is None else (row["id"], row["name"], row["payload"])

    async def database_now(self) -> datetime.datetime:
        """The database's clock now (timezone-aware)."""
        row = await self._db.fetch_one("database_now")
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]

    async def server_started(self) -> str:
        """When the database server started (ISO-8601 text): a restart changes it."""
        row = await self._db.fetch_one("server_started")
        assert row is not None
        return row["started"].isoformat()  # type: ignore[no-any-return]
