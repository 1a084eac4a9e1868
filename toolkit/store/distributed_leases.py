"""Claims and heartbeats on a store distributed by tenant (Citus; docs/scaling.md, issue 25).

Citus locks rows of one shard per statement: a claim or a heartbeat that locks the rows of
several tenants at once, as one PostgreSQL does them, is refused there. On a distributed
store, :class:`~toolkit.store.leases.Leases` therefore makes them tenant by tenant, each
statement routed to the node that holds the tenant:

- a claim reads its window of tenants without a lock (``claim_window``: the ready,
  unpaused tenants of lowest vtime, and those whose next due time has come, each promoted
  by ``promote_tenant``), shares its batch among them by weight (:func:`batch_shares`),
  then claims each tenant's share (``claim_tenant_tasks``; a tenant with a ``max_active``
  in a transaction that locks its row first, ``lock_limited_tenant``); what a tenant
  cannot fill goes to the tenants that filled their share, then to those given none;
- tasks waiting for a concurrency key are admitted key by key
  (:func:`admit_keys_per_tenant`), each key's lock on the coordinator and its tasks on its
  tenant's shard;
- a heartbeat renews each tenant's leases (``renew_tenant_leases``), then the worker's
  registration (``renew_registration``: the workers' table is a reference table), which
  then expires no sooner than the leases;
- a group commit writes each tenant's writes in a transaction of their own
  (:func:`record_on_shard`): Citus routes no statement that inserts in a CTE, nor one that
  changes a reference table, to one shard, so the fenced write's inserts (evidence, events,
  branch rows, key wakes) and the scheduled runs' outcomes follow it as statements of
  their own.

Fairness across tenants holds by the rotation's vtime (the tenants served move on by the
tasks they got per unit of weight) and the batch's split by weight; unlike one
PostgreSQL's claim, the split does not count the leases a tenant already holds (that count
would read every shard on every claim).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from toolkit.errors import ToolkitError
from toolkit.lifecycle import TaskState
from toolkit.store.database import Database
from toolkit.store.fence import Fence
from toolkit.store.queries import query
from toolkit.store.writes import FencedWrite

logger = logging.getLogger(__name__)


def batch_shares(limit: int, weights: Sequence[float]) -> list[int]:
    """Split a batch of ``limit`` tasks among tenants in rotation order, by weight.

    Args:
        limit: tasks in the batch (≥ 0).
        weights: each tenant's weight (> 0), lowest vtime first.

    Returns:
        Each tenant's share, in the same order, summing to ``limit`` when there are tenants:
        proportional to its weight, at least one while the batch lasts (so with more tenants
        than tasks, the first ``limit`` tenants get one each), any rounding remainder to the
        first tenants.
    """
    shares = [0] * len(weights)
    if not weights or limit <= 0:
        return shares
    total = sum(weights)
    left = limit
    for index, weight in enumerate(weights):
        share = min(left, max(1, int(limit * weight / total)))
        shares[index] = share
        left -= share
        if left == 0:
            return shares
    for index in itertools.cycle(range(len(weights))):
        shares[index] += 1
        left -= 1
        if left == 0:
            return shares
    raise AssertionError("unreachable")  # pragma: no cover


async def claim_per_tenant(
    db: Database, params: dict[str, Any]
) -> tuple[list[DictRow], dict[str, Any]]:
    """The claim on a distributed store: tenant by tenant, each statement on one shard.

    Args:
        db: the store's database.
        params: the claim's parameters (``worker_id``, ``digests``, ``limit``,
            ``lease_seconds``, ``deferring``, ``window``; see ``Leases.claim``).

    Returns:
        ``(rows, summary)``: the claimed tasks' rows (``claimed_columns``), and what the
        claim leaves to do: ``dry`` (the tenants asked that had nothing due for this worker),
        ``window_full`` and ``key_wakes`` (as ``claim_tasks``' summary says them).

    Raises:
        DatabaseUnavailable: the database cannot be reached (what was claimed before is
            claimed: its leases expire and are taken over).
    """
    window = await db.fetch_all("claim_window", {"window": params["window"]})
    flags = window[0]
    tenants = [row for row in window if row["tenant"] is not None]
    floor = min((row["vtime"] for row in tenants if not row["promoted"]), default=None)
    served: list[DictRow] = []
    for row in tenants:
        if row["promoted"]:
            promoted = await db.fetch_one(
                "promote_tenant", {"tenant": row["tenant"], "floor": floor}
            )
            if promoted is None or not promoted["serve"]:
                continue
        served.append(row)
    claimed: list[DictRow] = []
    dry: list[str] = []
    more: list[DictRow] = []  # tenants that filled their share, then those given none
    limit = int(params["limit"])
    shares = batch_shares(limit, [float(row["weight"]) for row in served])
    for row, share in zip(served, shares, strict=True):
        if share == 0:
            break
        rows = await _claim_tenant(db, params, row, share)
        if rows is None:
            continue  # a limited tenant another claimer holds: skipped this round
        claimed += rows
        if not rows:
            dry.append(row["tenant"])
        elif len(rows) == share:
            more.append(row)
    more += [row for row, share in zip(served, shares, strict=True) if share == 0]
    for row in more:  # what the dry and the limited left of the batch
        left = limit - len(claimed)
        if left <= 0:
            break
        claimed += await _claim_tenant(db, params, row, left) or []
    claimed.sort(key=lambda claim: claim["id"])
    summary = {"dry": dry, "window_full": flags["window_full"], "key_wakes": flags["key_wakes"]}
    return claimed, summary


async def _claim_tenant(
    db: Database, params: dict[str, Any], tenant: DictRow, limit: int
) -> list[DictRow] | None:
    """Up to ``limit`` tasks of one tenant claimed, with their events, in one transaction.

    None: the tenant has a ``max_active`` and another claimer holds its row.
    """
    claim = {**params, "tenant": tenant["tenant"], "limit": limit, "locked": False}
    async with db.transaction() as conn:
        cursor = conn.cursor(row_factory=dict_row)
        if tenant["max_active"] is not None:
            await cursor.execute(query("lock_limited_tenant"), claim)
            if await cursor.fetchone() is None:
                return None
            claim["locked"] = True
        await cursor.execute(query("claim_tenant_tasks"), claim)
        rows = await cursor.fetchall()
        events = [
            {
                "task_id": row["id"], "tenant": row["tenant"], "kind": row["event_kind"],
                "worker_id": params["worker_id"], "token": row["lease_token"],
                "detail": _jsonb(row["event_detail"]),
            }
            for row in rows
        ]  # fmt: skip
        if events:
            await cursor.executemany(query("record_event"), events)
        return rows


async def admit_keys_per_tenant(db: Database, max_keys: int) -> tuple[int, bool]:
    """The key admission on a distributed store: key by key, each on its tenant's shard.

    One PostgreSQL admits in one call (``toolkit_admit_keys``), which locks the parked tasks
    of several tenants; Citus refuses that. Here the keys with wake rows are read without
    a lock (``key_wake_window``), then each key is admitted in a transaction of its own:
    its advisory lock, tried without waiting (``try_key_lock``: a key another admission
    holds is left to it), then ``admit_tenant_key`` and the admitted tasks' events
    (``record_key_admissions``).

    Args:
        db: the store's database.
        max_keys: most keys to admit in this call.

    Returns:
        ``(admitted, remaining)``: how many tasks were admitted, and whether keys still have
        wake rows.

    Raises:
        DatabaseUnavailable: the database cannot be reached (what was admitted before is
            admitted; a key not yet decided keeps its wake rows).
    """
    admitted = 0
    for key in await db.fetch_all("key_wake_window", {"max_keys": max_keys}):
        params = {
            "tenant": key["tenant"],
            "name": key["definition_name"],
            "key": key["concurrency_key"],
        }
        async with db.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(query("try_key_lock"), params)
            lock = await cursor.fetchone()
            if lock is None or not lock["held"]:
                continue
            await cursor.execute(query("admit_tenant_key"), params)
            rows = await cursor.fetchall()
            if rows:
                await cursor.execute(
                    query("record_key_admissions"),
                    {
                        "tenant": key["tenant"],
                        "ids": [row["id"] for row in rows],
                        "keys": [row["concurrency_key"] for row in rows],
                        "limits": [row["concurrency_limit"] for row in rows],
                        "holders": [row["holders"] for row in rows],
                    },
                )
        admitted += len(rows)
    left = await db.fetch_one("key_wakes_left", {})
    return admitted, bool(left and left["remaining"])


async def renew_per_tenant(
    db: Database, params: dict[str, Any], fences: Sequence[Fence]
) -> tuple[bool, list[DictRow]]:
    """The heartbeat on a distributed store: each tenant's leases, then the registration.

    The registration is renewed last, so that it expires no sooner than any lease it
    renewed (a statement's time is its own): the worker id is taken over only once its
    registration expired, and by then so have its leases, as with one statement on one
    PostgreSQL.

    Args:
        db: the store's database.
        params: ``worker_id``, ``incarnation``, ``lease_seconds`` (see ``Leases.renew``).
        fences: every lease the process holds.

    Returns:
        ``(registered, rows)``: whether the registration is still this process's, and the
        rows of ``renew_tenant_leases`` for every tenant (one per lease renewed or ended).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    rows: list[DictRow] = []
    by_tenant = sorted(fences, key=lambda fence: (fence.tenant, fence.task_id))
    for tenant, group in itertools.groupby(by_tenant, key=lambda fence: fence.tenant):
        held = list(group)
        rows += await db.fetch_all(
            "renew_tenant_leases",
            {
                **params,
                "tenant": tenant,
                "task_ids": [fence.task_id for fence in held],
                "tenants": [tenant] * len(held),
                "tokens": [fence.token for fence in held],
            },
            reserved=True,
        )
    registered = await db.fetch_all("renew_registration", params, reserved=True)
    return bool(registered and registered[0]["registered"]), rows


@dataclasses.dataclass
class ShardWrites:
    """What one tenant's fenced writes came to (`record_on_shard`).

    ``applied``: task id to applied state, as ``commit_fenced`` returns them;
    ``limits_unwoken``: global limits whose released slots woke no task of the tenant, with
    how many more waiters each may wake, once the transaction commits
    (`wake_other_tenants`).
    """

    applied: dict[int, TaskState]
    limits_unwoken: dict[str, int]


async def record_on_shard(
    cursor: AsyncCursor[DictRow], writes: Sequence[FencedWrite], params: dict[str, Any]
) -> ShardWrites:
    """One tenant's fenced writes on a distributed store, in the transaction of ``cursor``.

    ``commit_fenced_on_shard`` (routed to the tenant's shard), then what it leaves to
    statements of their own: the rows the writes applied insert and the wake rows of the
    keys they released, an ``INSERT`` of values per row, sent together (``record_evidence``,
    ``record_branch``, ``record_event``, ``record_cancel_found``, ``record_key_wake``: each
    routed to the shard, so the transaction commits in one phase), and the outcomes of the
    scheduled runs they ended (``count_schedule_outcomes``).

    Args:
        cursor: a cursor (dict rows) inside the group commit's transaction.
        writes: the writes, all of ``params["tenant"]``.
        params: ``commit_fenced``'s parameters.

    Returns:
        What they applied, and the global limits' waiters left to wake.
    """
    await cursor.execute(query("commit_fenced_on_shard"), params)
    rows = await cursor.fetchall()
    unwoken = next((row["limits_unwoken"] for row in rows if row["limits_unwoken"]), None)
    fresh = [row for row in rows if row["cancelling"] is not None]  # not replayed
    by_task = {write.fence.task_id: write for write in writes}
    worker_id = params["worker_id"]
    for name, rows_of in (
        ("record_evidence", _evidence_rows), ("record_branch", _branch_rows),
        ("record_event", _event_rows), ("record_cancel_found", _cancel_rows),
        ("record_key_wake", _key_wake_rows),
    ):  # fmt: skip
        values = [value for row in fresh for value in rows_of(by_task[row["id"]], row, worker_id)]
        if values:
            await cursor.executemany(query(name), values)
    runs = sorted((row for row in fresh if row["schedule_name"]), key=lambda r: r["id"])
    if runs:
        await cursor.execute(
            query("count_schedule_outcomes"),
            {
                "ids": [row["id"] for row in runs],
                "schedules": [row["schedule_name"] for row in runs],
                "states": [row["state"] for row in runs],
            },
        )
    applied = {row["id"]: TaskState(row["state"]) for row in rows}
    return ShardWrites(applied, {name: int(n) for name, n in (unwoken or {}).items()})


async def wake_other_tenants(db: Database, tenant: str, limits: Mapping[str, int]) -> None:
    """Wake the next waiters of other tenants for global limits whose slots were freed.

    On a store distributed by tenant, a group commit of ``tenant``'s writes is routed to its
    shard: a released slot of a global limit wakes a waiting task of that tenant in the same
    statement, and this wakes those of the other tenants (docs/limits.md), after the commit
    (so that a woken task finds the slot free). Each limit's ``n`` waiters due soonest are read
    without a lock (``next_limit_waiters``), then made due tenant by tenant
    (``wake_limit_waiters``); a task made due finds its slot, or waits again.

    The writes have committed: a failure here is logged, not raised (their writers must
    not send them again), and the waiters look again at their own time, at most 30 s later.

    Args:
        db: the store's database.
        tenant: the tenant whose writes released the slots.
        limits: limit name to how many waiters to wake.
    """
    try:
        for name, n in sorted(limits.items()):
            params = {"name": name, "tenant": tenant, "n": n}
            for row in await db.fetch_all("next_limit_waiters", params):
                await db.fetch_one(
                    "wake_limit_waiters",
                    {"name": name, "tenant": row["tenant"], "ids": row["ids"]},
                )
    except ToolkitError as exc:
        logger.warning(
            "waiters of other tenants for limits %s not woken (they look again later): %s",
            sorted(limits), exc, extra={"action": "limit_wake_failed", "tenant": tenant},
        )  # fmt: skip


#: One row's values for a record_* statement (see `record_on_shard`).
RowValues = dict[str, Any]


def _jsonb(value: Any) -> Jsonb | None:
    """A JSON value as a parameter, None as SQL NULL.

    ``jsonb_to_recordset`` reads a JSON null as SQL NULL, so both paths store the same.
    """
    return None if value is None else Jsonb(value)


def _evidence_rows(write: FencedWrite, applied: DictRow, worker_id: str) -> list[RowValues]:
    """``record_evidence``'s values for an applied write: its evidence records."""
    fence = write.fence
    return [
        {
            "task_id": fence.task_id, "tenant": fence.tenant, "occurrence": r.occurrence,
            "step": r.step, "handler": r.handler, "idempotent": r.idempotent,
            "idempotency_key": r.idempotency_key, "record": r.record, "attempt": r.attempt,
            "token": fence.token, "worker_id": worker_id, "result": _jsonb(r.result),
            "error": _jsonb(r.error), "spend": _jsonb(r.spend),
        }
        for r in write.evidence
    ]  # fmt: skip


def _branch_rows(write: FencedWrite, applied: DictRow, worker_id: str) -> list[RowValues]:
    """``record_branch``'s values for an applied write: its branch rows."""
    fence = write.fence
    return [
        {
            "task_id": fence.task_id, "tenant": fence.tenant, "fanout": b.fanout,
            "name": b.name, "position": b.position, "status": b.status,
            "frame": Jsonb(b.frame), "run_at": b.run_at, "waits_for": list(b.waits_for),
            "seen": b.seen,
        }
        for b in write.branches
    ]  # fmt: skip


def _event_rows(write: FencedWrite, applied: DictRow, worker_id: str) -> list[RowValues]:
    """``record_event``'s values for an applied write: its events."""
    fence = write.fence
    return [
        {
            "task_id": fence.task_id, "tenant": fence.tenant, "kind": e.kind,
            "worker_id": worker_id, "token": fence.token, "detail": _jsonb(e.detail),
        }
        for e in write.events
    ]  # fmt: skip


def _cancel_rows(write: FencedWrite, applied: DictRow, worker_id: str) -> list[RowValues]:
    """``record_cancel_found``'s values: one when the write found a cancel request."""
    fence = write.fence
    if not applied["cancelling"]:
        return []
    return [{"task_id": fence.task_id, "tenant": fence.tenant, "worker_id": worker_id,
             "token": fence.token}]  # fmt: skip


def _key_wake_rows(write: FencedWrite, applied: DictRow, worker_id: str) -> list[RowValues]:
    """``record_key_wake``'s values: one when the write ended a holder of a key."""
    if applied["released_key"] is None:
        return []
    return [{"tenant": write.fence.tenant, "definition_name": applied["released_definition"],
             "concurrency_key": applied["released_key"]}]  # fmt: skip
