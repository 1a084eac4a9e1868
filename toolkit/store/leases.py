"""Leases and fenced writes: claim, heartbeat, commit (DESIGN §2, §4).

Every state-changing write carries ``(worker_id, token)`` and is applied only while that
lease is held and unexpired, in the same statement; otherwise it changes nothing and the
caller gets :class:`~toolkit.errors.LeaseLost`.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import anyio
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from toolkit.errors import DatabaseUnavailable, LeaseLost, StoreError, ToolkitError
from toolkit.lifecycle import EventKind, TaskState, WaitReason
from toolkit.payload import PayloadLimits
from toolkit.store.database import Database
from toolkit.store.fence import Fence
from toolkit.store.queries import query

#: The ``run_at`` of a wait with no deadline: later than any real time, yet a value Python's
#: ``datetime`` can hold (PostgreSQL's ``'infinity'`` cannot be loaded into one).
NEVER = "9999-12-31T00:00:00+00:00"

#: Waits that something sent from outside ends (a signal, a callback completion): the commit
#: of such a wait looks for what was sent while it queued for the task's row (see
#: :meth:`Leases.commit_many`).
_RACED = frozenset({WaitReason.SIGNAL, WaitReason.CALLBACK})


@dataclasses.dataclass(frozen=True)
class ClaimedTask:
    """A task this worker now leases.

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

    def fence(self, worker_id: str) -> Fence:
        """The fence of this lease, held by ``worker_id``."""
        return Fence(worker_id, self.id, self.tenant, self.token)


@dataclasses.dataclass(frozen=True)
class EvidenceRecord:
    """One effect evidence record to append (``started``, ``completed`` or ``failed``)."""

    occurrence: str
    step: str
    handler: str
    idempotent: bool
    idempotency_key: str
    record: Literal["started", "completed", "failed"]
    attempt: int
    result: Any = None
    error: Any = None
    spend: Mapping[str, float] | None = None


@dataclasses.dataclass(frozen=True)
class Event:
    """One task event to append (the history of transitions)."""

    kind: EventKind
    detail: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class FencedWrite:
    """Everything one fenced statement writes for one task.

    Attributes:
        fence: the lease the writer holds.
        checkpoint: the new checkpoint JSON; None keeps the stored one, its cursor cleared
            (a task failed over what it has in the store).
        state: the task's next state; ``leased`` keeps the lease, any other releases it.
        wait_reason: required with ``waiting``.
        run_at: when set, the new ``run_at``: an ISO-8601 timestamp (:data:`NEVER` for none).
        delay_seconds: when set (and ``run_at`` is not), ``run_at`` becomes database now +
            this many seconds.
        result: the task result (terminal ``succeeded``).
        error: the task error (terminal ``failed``), JSON.
        evidence: effect evidence records to append, in order.
        events: task events to append, in order.
        signals: ``(signal id, occurrence)`` of signals consumed by this write.
        write_id: an id unique to this write (``TOKEN:N``, the N-th write under the lease),
            stored in the checkpoint as ``write``. Sending the same write again (after a
            dropped connection left its outcome unknown) then applies it at most once: a write
            already applied is reported applied, nothing appended twice. None: no such check.
        budget_delta: amounts to add to the task's tenant budget use, by resource (spend
            outside a reservation; a released reservation's unspent part is negative).
            None: nothing.
        budget_released: reservations returned by steps that ended, by resource: taken
            off the reserved part of the tenant's budget use (the unspent part leaves it
            through ``budget_delta``). None: nothing.
        clear_deadline: drop the task's workflow deadline (it was met by ``on_timeout``).

    A signal or callback wait (``waiting``, reason ``signal`` or ``callback``) is made due
    at once, in the transaction that commits it, when a signal it waits for is stored and not
    consumed by this write, or its callback is completed.
    """

    fence: Fence
    checkpoint: Mapping[str, Any] | None
    state: TaskState = TaskState.LEASED
    wait_reason: WaitReason | None = None
    run_at: str | None = None
    delay_seconds: float | None = None
    result: Any = None
    error: Any = None
    evidence: Sequence[EvidenceRecord] = ()
    events: Sequence[Event] = ()
    signals: Sequence[tuple[int, str]] = ()
    write_id: str | None = None
    budget_delta: Mapping[str, float] | None = None
    budget_released: Mapping[str, float] | None = None
    clear_deadline: bool = False


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

    @property
    def database(self) -> Database:
        """The database these leases live in."""
        return self._db

    @property
    def payload_limits(self) -> PayloadLimits:
        """The size and nesting limits of stored JSON values (the database's)."""
        return self._db.payload_limits

    async def claim(
        self, worker_id: str, digests: Sequence[str], limit: int, lease_seconds: float
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

        Args:
            worker_id: the claiming worker's id.
            digests: definition digests this worker has loaded; no other task is claimed.
            limit: most tasks to claim.
            lease_seconds: lease duration, seconds, from database now.

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
            "locked": [],
        }
        rows: list[Any] = []
        if self._one_tenant is not None:
            rows = await self._db.fetch_all(
                "claim_tasks_one_tenant", {**params, "tenant": self._one_tenant}
            )
            if not rows:
                self._one_tenant = None  # not alone any more, or nothing due: the fair claim
        if not rows:
            rows = await self._fair_claim(params)
        if rows and rows[0]["tenants"] == 1 and not rows[0]["limits"]:
            self._one_tenant = rows[0]["tenant"]
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
            )
            for row in rows
        ]

    async def _fair_claim(self, params: dict[str, Any]) -> list[Any]:
        """The claim across tenants: one statement, or locking the limited tenants first."""
        if not self._limits:
            rows = await self._db.fetch_all("claim_tasks", params)
            # Nothing claimed tells nothing: take the locking path until a claim says.
            self._limits = not rows or bool(rows[0]["limits"])
            return rows
        async with self._db.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(query("lock_limited_tenants"))
            params["locked"] = [row["tenant"] for row in await cursor.fetchall()]
            await cursor.execute(query("claim_tasks"), params)
            rows = await cursor.fetchall()
        if rows and not params["locked"]:
            self._limits = bool(rows[0]["limits"])
        return rows

    async def renew(
        self, worker_id: str, fences: Sequence[Fence], lease_seconds: float
    ) -> dict[int, Any]:
        """Extend every lease of ``fences`` in one statement (the heartbeat).

        Args:
            worker_id: the holder (it renews its registration too, with no lease held).
            fences: every lease the process holds, all held by ``worker_id``.
            lease_seconds: new lease duration from database now, seconds.

        Returns:
            For each task whose lease was renewed, its cancel request (``{"reason", "at"}``)
            or None; any task of ``fences`` missing here has lost its lease.

        Runs on the database's reserved connection, so handlers holding every connection of
        the main pool do not starve it. Idempotent: safe to send again.

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        rows = await self._db.fetch_all(
            "renew_leases",
            {
                "worker_id": worker_id,
                "task_ids": [fence.task_id for fence in fences],
                "tokens": [fence.token for fence in fences],
                "lease_seconds": lease_seconds,
            },
            reserved=True,
        )
        return {row["id"]: row["cancel_requested"] for row in rows}

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
        apply. All applied writes commit together. A batch with signal or callback waits is
        one transaction of two statements: the second makes such a wait due when what it
        waits for was sent while the first queued for the task's row (the sender then saw
        the task leased, and the first statement's snapshot predates the send); so a wait
        and its wake-up commit together or not at all. A write whose ``write_id`` is already
        stored (it was applied by an earlier send) is reported with the task's state and
        applied again never.

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
        (worker_id,) = {write.fence.worker_id for write in writes}
        params = {"worker_id": worker_id, "writes": Jsonb([_write_json(w) for w in writes])}
        waits = [
            w.fence.task_id
            for w in writes
            if w.state == TaskState.WAITING and w.wait_reason in _RACED
        ]
        if not waits:  # the hot path: one statement
            rows = await self._db.fetch_all("commit_fenced", params)
            return {row["id"]: TaskState(row["state"]) for row in rows}
        async with self._db.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(query("commit_fenced"), params)
            applied = {row["id"]: TaskState(row["state"]) for row in await cursor.fetchall()}
            raced = [task_id for task_id in waits if applied.get(task_id) == "waiting"]
            if raced:
                await cursor.execute(query("wake_raced_waits"), {"task_ids": raced})
        return applied

    async def next_signal(
        self, task_id: int, names: Sequence[str], taken: Sequence[int] = ()
    ) -> tuple[int, str, Any] | None:
        """The oldest unconsumed signal of the task named one of ``names``.

        Args:
            task_id: the task.
            names: the signal names.
            taken: ids already taken by this cycle but not yet marked consumed.

        Returns:
            ``(signal id, name, payload)``, or None.
        """
        row = await self._db.fetch_one(
            "next_signal", {"task_id": task_id, "names": list(names), "taken": list(taken)}
        )
        return None if row is None else (row["id"], row["name"], row["payload"])

    async def database_now(self) -> datetime.datetime:
        """The database's clock now (timezone-aware)."""
        row = await self._db.fetch_one("database_now")
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]


def _write_json(write: FencedWrite) -> dict[str, Any]:
    return {
        "task_id": write.fence.task_id,
        "tenant": write.fence.tenant,
        "token": write.fence.token,
        "checkpoint": write.checkpoint,
        "state": write.state,
        "wait_reason": write.wait_reason,
        "run_at": write.run_at,
        "delay_seconds": write.delay_seconds,
        "result": write.result,
        "error": write.error,
        "evidence": [
            {
                "occurrence": r.occurrence,
                "step": r.step,
                "handler": r.handler,
                "idempotent": r.idempotent,
                "idempotency_key": r.idempotency_key,
                "record": r.record,
                "attempt": r.attempt,
                "result": r.result,
                "error": r.error,
                "spend": r.spend,
            }
            for r in write.evidence
        ],
        "events": [{"kind": e.kind, "detail": e.detail} for e in write.events],
        "signals": [{"id": sid, "occurrence": occ} for sid, occ in write.signals],
        "write_id": write.write_id,
        "budget_delta": write.budget_delta,
        "budget_released": write.budget_released,
        "clear_deadline": write.clear_deadline,
    }


class GroupCommit:
    """Gathers the fenced writes of concurrent cycles into one statement (DESIGN §4).

    A cycle calls :meth:`commit` and waits; the writer (:meth:`run`, a task of the
    supervisor) takes every write queued by then, lets the event loop run once more so that
    cycles finishing at the same moment join, and applies them with one
    :meth:`Leases.commit_many`. Each write stays fenced on its own. If the database refuses
    the batch (a value it cannot store), each write is retried alone so only the faulty one
    fails.

    Args:
        leases: the store's leases.
        max_batch: most writes per statement.
    """

    def __init__(self, leases: Leases, max_batch: int = 256) -> None:
        self._leases = leases
        self._max_batch = max_batch
        self._queue: list[_PendingWrite] = []
        self._ready = anyio.Event()
        self._running = False
        self._shield: anyio.CancelScope | None = None
        self._stop_deadline = math.inf

    async def commit(self, write: FencedWrite) -> TaskState:
        """Apply ``write`` with the next batch; same contract as :meth:`Leases.commit`.

        Falls back to a statement of its own when no writer runs.
        """
        if not self._running:
            return await self._leases.commit(write)
        pending = _PendingWrite(write)
        self._queue.append(pending)
        self._ready.set()
        # A cycle cancelled while it waits here leaves its write queued: the write carries
        # evidence the cycle has already handed over, and it applies (fenced) before any
        # later write of the same task (one write per task per batch).
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        if pending.state is None:
            raise LeaseLost(task_id=write.fence.task_id, token=write.fence.token)
        return pending.state

    def stop_soon(self, grace: float) -> None:
        """Give the batch in flight at most ``grace`` more seconds once the writer is cancelled.

        A batch in flight is shielded from cancellation so that it is not cut off half-way;
        during an outage it could wait for a connection for the pool's whole timeout. Call
        this before cancelling :meth:`run`: past ``grace`` the batch is abandoned (the fence
        and the write ids keep that safe) and its writers get ``DatabaseUnavailable``.
        """
        self._stop_deadline = anyio.current_time() + grace
        if self._shield is not None:
            self._shield.deadline = self._stop_deadline

    async def run(self) -> None:
        """The writer loop; runs until cancelled, then fails every write still queued."""
        self._running = True
        try:
            while True:
                await self._ready.wait()
                self._ready = anyio.Event()
                await anyio.sleep(0)  # one more turn of the loop: let simultaneous writes join
                while self._queue:
                    batch = self._take_batch()
                    with anyio.CancelScope(shield=True, deadline=self._stop_deadline) as shield:
                        self._shield = shield
                        await self._apply(batch)
                    self._shield = None
                    for pending in batch:  # abandoned at the stop deadline
                        if not pending.done.is_set():
                            pending.finish(error=_writer_stopped())
        finally:
            self._running = False
            for pending in self._queue:
                pending.finish(error=_writer_stopped())
            self._queue.clear()

    def _take_batch(self) -> list[_PendingWrite]:
        """Take up to ``max_batch`` queued writes, at most one per task, in queue order.

        A second write of the same task (one queued by a cycle cancelled while its previous
        write waited) stays queued for the next batch, so the two apply in order.
        """
        batch: list[_PendingWrite] = []
        later: list[_PendingWrite] = []
        tasks: set[int] = set()
        for pending in self._queue:
            if len(batch) < self._max_batch and pending.write.fence.task_id not in tasks:
                tasks.add(pending.write.fence.task_id)
                batch.append(pending)
            else:
                later.append(pending)
        self._queue[:] = later
        return batch

    async def _apply(self, batch: list[_PendingWrite]) -> None:
        try:
            applied = await self._leases.commit_many([p.write for p in batch])
        except StoreError as exc:
            if len(batch) == 1:
                batch[0].finish(error=exc)
                return
            for pending in batch:  # apply one by one: only the refused write fails
                await self._apply([pending])
            return
        except ToolkitError as exc:
            for pending in batch:
                pending.finish(error=exc)
            return
        except Exception as exc:  # e.g. a value the driver cannot adapt: the writer lives on
            if len(batch) > 1:
                for pending in batch:
                    await self._apply([pending])
                return
            batch[0].finish(error=StoreError(f"the write could not be sent: {exc!r}"))
            return
        for pending in batch:
            pending.finish(state=applied.get(pending.write.fence.task_id))


def _writer_stopped() -> DatabaseUnavailable:
    return DatabaseUnavailable("the worker's writer stopped before this write was applied")


class _PendingWrite:
    """A write waiting for its batch: the result is a state, None (lease lost) or an error."""

    def __init__(self, write: FencedWrite) -> None:
        self.write = write
        self.done = anyio.Event()
        self.state: TaskState | None = None
        self.error: ToolkitError | None = None

    def finish(self, *, state: TaskState | None = None, error: ToolkitError | None = None) -> None:
        self.state = state
        self.error = error
        self.done.set()
