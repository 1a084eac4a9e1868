"""Acquisitions of downstream limits, batched per process (docs/limits.md, DESIGN §2).

Acquisitions of one scope take turns on its bucket row, and each turn lasts until its
transaction's commit is flushed. One acquisition per transaction made a limit's scope a
queue of single calls, a few hundred a second at most whatever the fleet. Here the
concurrent acquisitions of one process go together: the first to arrive leads a batch of
every acquisition queued by then, one transaction, one turn of each scope's lock and one
flush; the others wait for it. A batch's acquisitions are decided in queue order against
the state read under the locks, counting what the earlier ones of the batch took; each is
granted whole or deferred whole, and each stays fenced by its own lease.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
from psycopg import AsyncConnection, AsyncCursor, Rollback
from psycopg.rows import DictRow, dict_row

from toolkit.errors import LeaseLost
from toolkit.store.database import Database
from toolkit.store.fence import Fence, fence_params
from toolkit.store.queries import query

#: First pause of a task deferred for a full concurrency limit, seconds; it doubles with
#: each deferral of the same step up to :data:`SLOT_RECHECK_MAX`. A released slot wakes the
#: first waiting task at once: this is only the fallback.
SLOT_RECHECK_MIN = 0.25
SLOT_RECHECK_MAX = 30.0
#: Shortest deferral, seconds (a bucket a hair short of a token).
MIN_DEFERRAL = 0.001
#: Most acquisitions in one batch (one transaction).
MAX_BATCH = 64


@dataclasses.dataclass(frozen=True)
class LimitGrant:
    """Every limit of the step had room; the slots and tokens are taken.

    Attributes:
        now: the database's time of the acquisition.
    """

    now: datetime.datetime


@dataclasses.dataclass(frozen=True)
class LimitDeferral:
    """A limit of the step is full: nothing was taken.

    Attributes:
        name: the first full limit (by name).
        scope: its scope (``""``, or the tenant).
        reason: ``concurrency`` (no free slot) or ``rate`` (no token).
        delay_seconds: when a slot or token is expected, seconds from ``now``: a token at
            the bucket's refill time counting the tasks already waiting for it; a slot at
            the earliest lease expiry of its holders, or sooner (a recheck that doubles with
            each deferral; a released slot also wakes the first waiting task at once).
        now: the database's time of the acquisition.
    """

    name: str
    scope: str
    reason: str
    delay_seconds: float
    now: datetime.datetime

    @property
    def until(self) -> datetime.datetime:
        """``now + delay_seconds``: when to try again, database time."""
        return self.now + datetime.timedelta(seconds=self.delay_seconds)


class Acquisitions:
    """The acquisitions of one process, batched: one transaction for those queued together.

    Args:
        db: the store's database.
        max_batch: most acquisitions per transaction.
    """

    def __init__(self, db: Database, max_batch: int = MAX_BATCH) -> None:
        self._db = db
        self._max_batch = max_batch
        self._queue: list[_Acquisition] = []
        self._leading = False

    async def acquire(
        self, fence: Fence, occurrence: str, names: Sequence[str], deferrals: int
    ) -> LimitGrant | LimitDeferral:
        """Take the limits with the next batch; the contract of :meth:`Limits.acquire`.

        The first acquisition to arrive while no batch is being made leads: it lets the
        event loop run once, so that acquisitions made at the same moment join, and takes
        up to ``max_batch`` of the queue (one per task) into one transaction. When its own
        is decided it hands the lead to the first still queued. A leader cancelled half-way
        puts the batch's others back in the queue (the transaction rolls back, or, if its
        commit went through, their slots are found held under their leases when taken
        again).
        """
        request = _Acquisition(fence, occurrence, tuple(sorted(set(names))), deferrals)
        self._queue.append(request)
        if self._leading:
            try:
                await request.turn.wait()
            except BaseException:  # cancelled while queued, or just handed the lead
                if request in self._queue:
                    self._queue.remove(request)
                if request.leads:
                    self._hand_over()
                raise
        else:
            self._leading = True
            request.leads = True
        if request.leads:
            try:
                while request.outcome is None and request.error is None:
                    await anyio.sleep(0)  # one more turn of the loop: let simultaneous ones join
                    await self._apply(self._take_batch())
            finally:
                if request in self._queue:
                    self._queue.remove(request)
                self._hand_over()
        if request.error is not None:
            raise request.error
        assert request.outcome is not None
        return request.outcome

    def _hand_over(self) -> None:
        """The lead goes to the first acquisition queued, or nobody leads."""
        if self._queue:
            self._queue[0].leads = True
            self._queue[0].turn.set()
        else:
            self._leading = False

    def _take_batch(self) -> list[_Acquisition]:
        """Up to ``max_batch`` queued acquisitions, at most one per task, in queue order."""
        batch: list[_Acquisition] = []
        later: list[_Acquisition] = []
        tasks: set[int] = set()
        for request in self._queue:
            if len(batch) < self._max_batch and request.fence.task_id not in tasks:
                tasks.add(request.fence.task_id)
                batch.append(request)
            else:
                later.append(request)
        self._queue[:] = later
        return batch

    async def _apply(self, batch: list[_Acquisition]) -> None:
        """One transaction for ``batch``; every acquisition of it ends decided or failed."""
        try:
            async with self._db.connection() as conn, conn.pipeline(), conn.transaction():
                await _acquire_in(conn, batch)
        except Exception as exc:
            for request in batch:
                request.error = exc
        except BaseException:  # cancelled: the others go back to the queue, first, undecided
            others = [r for r in batch if not r.leads]
            for request in others:
                request.outcome, request.error = None, None
            self._queue[:0] = others
            raise
        for request in batch:
            request.turn.set()


class _Acquisition:
    """One step occurrence's acquisition, waiting for its batch."""

    def __init__(
        self, fence: Fence, occurrence: str, names: tuple[str, ...], deferrals: int
    ) -> None:
        self.fence = fence
        self.occurrence = occurrence
        self.names = names
        self.deferrals = deferrals
        self.turn = anyio.Event()
        self.leads = False
        self.outcome: LimitGrant | LimitDeferral | None = None
        self.error: BaseException | None = None


async def _acquire_in(conn: AsyncConnection[Any], batch: Sequence[_Acquisition]) -> None:
    """A batch's acquisitions in the transaction open on ``conn``, in pipeline mode.

    The tasks' leases (one statement each: a store distributed by tenant routes each to its
    shard; not locked, see ``lease_for_limits``), the scopes' locks, the slots held and the
    scopes' state are sent together, one round trip; what there is room for is taken by
    statements sent with the commit, a second. A limit's first acquisition in a scope,
    which adds its bucket, takes more. Each acquisition gets its outcome, or ``LeaseLost``;
    the transaction rolls back when none was granted (its locks need no flush).
    """
    pairs = [(name, r.fence.tenant) for r in batch for name in r.names]
    params = {
        "names": [name for name, _ in pairs],
        "tenants": [tenant for _, tenant in pairs],
        "task_ids": [r.fence.task_id for r in batch],
    }
    task, locked, held, state = (conn.cursor(row_factory=dict_row) for _ in range(4))
    await task.executemany(
        query("lease_for_limits"), [fence_params(r.fence) for r in batch], returning=True
    )
    await locked.execute(query("lock_limit_scopes"), params)
    await held.execute(
        query("limit_slots_held"),
        {**params, "tenants": sorted({r.fence.tenant for r in batch})},
    )
    await state.execute(query("limit_scope_state"), params)
    leased: list[_Acquisition] = []
    for request in batch:
        if await task.fetchone() is None:
            request.error = LeaseLost(
                f"task {request.fence.task_id}: lease lost before its limits were taken",
                task_id=request.fence.task_id,
                token=request.fence.token,
            )
        else:
            leased.append(request)
        task.nextset()
    scopes = _scopes(await locked.fetchall())
    holding = {
        (h["task_id"], h["occurrence"], h["name"], h["token"]) for h in await held.fetchall()
    }
    states = await state.fetchall()
    # A bucket missing (a limit's first acquisition in a scope, or a name the store does not
    # hold), or a limit's scope changed between the locks and the state (an operator's
    # `limits set --per-tenant`), so that the state is not of the scopes locked: add the
    # missing buckets, lock again, read again.
    again = len(scopes) < len(set(pairs)) or _scopes(states) != scopes
    while again:
        await conn.cursor().execute(query("add_limit_buckets"), params)
        await locked.execute(query("lock_limit_scopes"), params)
        scopes = _scopes(await locked.fetchall())
        await state.execute(query("limit_scope_state"), params)
        states = await state.fetchall()
        again = _scopes(states) != scopes
    now = states[0]["now"] if states else await _now(conn)
    taking = _Taking({(s["name"], s["scope"]): s for s in states}, holding, now)
    for request in leased:
        request.outcome = taking.decide(request)
    if not any(isinstance(r.outcome, LimitGrant) for r in leased):
        raise Rollback  # nothing taken: the transaction's locks need no flush
    await taking.take(state)


def _scopes(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(row["name"], row["scope"]) for row in rows]


class _Taking:
    """What a batch takes, decided acquisition by acquisition against the scopes' state.

    Args:
        states: ``limit_scope_state``'s rows by (name, scope).
        holding: (task id, occurrence, limit, lease token) of every slot the batch's tasks
            hold.
        now: the database's time of the state.
    """

    def __init__(
        self,
        states: dict[tuple[str, str], DictRow],
        holding: set[tuple[int, str, str, int]],
        now: datetime.datetime,
    ) -> None:
        self._states = states
        self._now = now
        self._per_tenant = {name: row["per_tenant"] for (name, _), row in states.items()}
        self._holding = holding
        self.slots: list[tuple[_Acquisition, str, str]] = []
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)
        self._slots_taken: dict[tuple[str, str], int] = defaultdict(int)
        self._deferred_for_tokens: dict[tuple[str, str], int] = defaultdict(int)

    def decide(self, request: _Acquisition) -> LimitGrant | LimitDeferral:
        """Grant ``request`` whole (counting its slots and tokens) or defer it whole."""
        fence = request.fence
        rows: list[tuple[DictRow, bool]] = []
        for name in request.names:
            if name not in self._per_tenant:  # a limit the store does not hold limits nothing
                continue
            row = self._states[name, fence.tenant if self._per_tenant[name] else ""]
            held = (fence.task_id, request.occurrence, name, fence.token) in self._holding
            key = (row["name"], row["scope"])
            deferral = _deferral(
                row,
                request.deferrals,
                held=held,
                in_use=row["in_use"] + self._slots_taken[key],
                tokens=None if row["tokens"] is None else row["tokens"] - self.tokens[key],
                waiting=row["waiting"] + self._deferred_for_tokens[key],
            )
            if deferral is not None:
                if deferral.reason == "rate":
                    self._deferred_for_tokens[deferral.name, deferral.scope] += 1
                return deferral
            rows.append((row, held))
        for row, held in rows:
            key = (row["name"], row["scope"])
            if row["rate_per_second"] is not None:
                self.tokens[key] += 1
            if row["max_concurrency"] is not None and not held:
                self._slots_taken[key] += 1
                self.slots.append((request, row["name"], row["scope"]))
        return LimitGrant(self._now)

    async def take(self, cursor: AsyncCursor[DictRow]) -> None:
        """Take the tokens and slots decided, in the batch's transaction.

        The stale slots of the scopes slots are taken in (counted by ``limit_scope_state``)
        are deleted first.
        """
        if self.tokens:
            rated = sorted(self.tokens)
            await cursor.execute(
                query("take_limit_tokens"),
                {
                    "rated": [name for name, _ in rated],
                    "rated_scopes": [scope for _, scope in rated],
                    "counts": [float(self.tokens[key]) for key in rated],
                },
            )
        if not self.slots:
            return
        slotted = sorted({(name, scope) for _, name, scope in self.slots})
        task_ids = [r.fence.task_id for r, _, _ in self.slots]
        if any(self._states[key]["stale"] for key in slotted):
            await cursor.execute(
                query("delete_stale_limit_slots"),
                {
                    "slotted": [name for name, _ in slotted],
                    "slotted_scopes": [scope for _, scope in slotted],
                    "task_ids": task_ids,
                },
            )
        await cursor.execute(
            query("take_limit_slots"),
            {
                "task_ids": task_ids,
                "tenants": [r.fence.tenant for r, _, _ in self.slots],
                "occurrences": [r.occurrence for r, _, _ in self.slots],
                "names": [name for _, name, _ in self.slots],
                "scopes": [scope for _, _, scope in self.slots],
                "tokens": [r.fence.token for r, _, _ in self.slots],
            },
        )


def _deferral(
    state: Mapping[str, Any],
    deferrals: int,
    *,
    held: bool,
    in_use: int,
    tokens: float | None,
    waiting: int,
) -> LimitDeferral | None:
    """The deferral a limit's scope calls for, or None when it has room (see `acquire`).

    ``in_use`` and ``tokens`` count what the acquisitions before this one in its batch took;
    ``waiting``, the tasks waiting for the bucket and those of the batch deferred for it.
    """
    delays: list[tuple[float, str]] = []
    limit = state["max_concurrency"]
    if limit is not None and not held and in_use >= limit:
        recheck = min(SLOT_RECHECK_MAX, SLOT_RECHECK_MIN * 2.0 ** min(deferrals, 16))
        first_free = state["first_free_seconds"]
        delays.append((min(recheck, first_free) if first_free is not None else recheck,
                       "concurrency"))  # fmt: skip
    if tokens is not None and tokens < 1:
        # Behind the tasks already waiting for this bucket: each takes a token first.
        delays.append(((1 - tokens + waiting) / state["rate_per_second"], "rate"))
    if not delays:
        return None
    delay, reason = max(delays)
    return LimitDeferral(
        name=state["name"],
        scope=state["scope"],
        reason=reason,
        delay_seconds=max(delay, MIN_DEFERRAL),
        now=state["now"],
    )


async def _now(conn: AsyncConnection[Any]) -> datetime.datetime:
    cursor = await conn.execute(query("database_now"))
    row = await cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]
