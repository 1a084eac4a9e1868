"""The fencing audit: check a task's stored history against the lease invariants (DESIGN §2).

The store keeps every claim (``claimed`` / ``recovered`` events, each with the fencing
token it issued), every effect evidence record and every event a fenced write appended,
each with the token it was written under and the database time it was recorded. From that
history alone the audit verifies, per task:

- **tokens only increase**: claims, in order, issue strictly increasing tokens, one more
  each time (:attr:`ViolationKind.TOKEN_NOT_INCREASING`, :attr:`ViolationKind.TOKEN_SKIPPED`);
- **no stale commit**: every record carrying a token was written under a token already
  issued when it was recorded (:attr:`ViolationKind.UNISSUED_TOKEN`), and no record under
  token *t* was recorded after a claim issued a higher token
  (:attr:`ViolationKind.STALE_TOKEN_COMMIT`);
- **no blind repeat**: a non-idempotent effect occurrence never has a second ``started``
  record unless the first was answered in between, by a recorded failure or a
  reconciliation (:attr:`ViolationKind.DOUBLE_START`);
- **fenced ending**: a terminal task's final write, its terminal event, carries the task's
  last token; only a direct cancel (``toolkit cancel`` of a queued, waiting or expired task)
  ends a task without one (:attr:`ViolationKind.TERMINAL_WRITE`);
- **one tenant**: every event and evidence record carries its task's tenant, the column a
  store distributed by tenant keeps them beside their task by
  (:attr:`ViolationKind.TENANT_MISMATCH`; migration 0026, docs/scaling.md).

Order is judged as the store recorded it: events among themselves by id (one sequence,
allocated at insert); evidence against claims by database timestamp (``recorded_at``
against the claim event's ``at``, both database time). A record whose insert
happened before a claim but whose transaction committed after it cannot be told apart from
history alone; the fence (the row lock of the fenced write) is what rules that out.

Each record is reported once, for its gravest fault: a terminal event written under a stale
or unissued token is a stale-token commit, not also a terminal-write violation.

Use :func:`audit_task` for one task, :func:`audit_all` for many (it pages through them, each
page in one read-only snapshot), or :func:`check_history` on a history built by hand.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import datetime
import enum
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.rows import class_row

from toolkit.counts import counted
from toolkit.errors import UnknownTask
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.queries import query

__all__ = [
    "AuditReport",
    "HistoryEvent",
    "HistoryEvidence",
    "TaskHistory",
    "Violation",
    "ViolationKind",
    "audit_all",
    "audit_task",
    "check_history",
    "load_histories",
]

#: Event kinds that issue a fencing token (a redrive bumps it as a claim does).
CLAIM_KINDS = frozenset({"claimed", "recovered", "redriven"})
#: Task states (and the event kinds that write them) that end a task.
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

_Row = TypeVar("_Row")


class ViolationKind(enum.StrEnum):
    """What invariant of DESIGN §2 a history breaks."""

    TOKEN_NOT_INCREASING = "token_not_increasing"
    """A claim issued a token not above every earlier one (or no token at all)."""
    TOKEN_SKIPPED = "token_skipped"
    """Claims skipped a token: one rose by more than one, or the task holds an unclaimed one."""
    UNISSUED_TOKEN = "unissued_token"
    """A record carries a token no claim had issued when it was recorded."""
    STALE_TOKEN_COMMIT = "stale_token_commit"
    """A record under token t was recorded after a claim issued a higher token."""
    DOUBLE_START = "double_start"
    """A non-idempotent occurrence was started again with no outcome or reconciliation between."""
    TERMINAL_WRITE = "terminal_write"
    """A terminal task's final write is missing, unfenced, or not under its last token."""
    TENANT_MISMATCH = "tenant_mismatch"
    """A record carries a tenant other than its task's."""


@dataclasses.dataclass(frozen=True)
class HistoryEvent:
    """One row of ``toolkit_task_events`` as the audit reads it.

    Attributes:
        id: event id (insertion order across all tasks).
        task_id: the task.
        kind: ``submitted``, ``claimed``, ``recovered``, ``succeeded``, ``reconciled`` ...
        worker_id: the writer (a worker, or the operator of a reconciliation); None for
            writes that are not a worker's (submit, signal, direct cancel).
        fencing_token: the token issued (claims) or written under; None when unfenced.
        occurrence: for ``reconciled``, the effect occurrence it resolves; else None.
        at: database time of the insert.
        tenant: the tenant it was stored under (None: not known, not checked).
    """

    id: int
    task_id: int
    kind: str
    worker_id: str | None
    fencing_token: int | None
    occurrence: str | None
    at: datetime.datetime
    tenant: str | None = None


@dataclasses.dataclass(frozen=True)
class HistoryEvidence:
    """One row of ``toolkit_effect_evidence`` as the audit reads it.

    Attributes:
        id: record id (insertion order across all tasks).
        task_id: the task.
        occurrence: the step occurrence, e.g. ``charge#1``.
        step: the step id.
        idempotent: the step's ``idempotent`` flag.
        record: ``started``, ``completed`` or ``failed``.
        worker_id: the writer: a worker, or the operator of a reconciliation.
        fencing_token: the token it was written under.
        recorded_at: database time of the insert.
        tenant: the tenant it was stored under (None: not known, not checked).
    """

    id: int
    task_id: int
    occurrence: str
    step: str
    idempotent: bool
    record: str
    worker_id: str
    fencing_token: int
    recorded_at: datetime.datetime
    tenant: str | None = None


@dataclasses.dataclass(frozen=True)
class TaskHistory:
    """Everything the audit knows of one task.

    Attributes:
        task_id: the task.
        state: its current state.
        lease_token: the task row's token (the last one issued).
        events: its events, oldest (lowest id) first.
        evidence: its effect evidence, oldest (lowest id) first.
        tenant: the task's tenant (None: not known; records are then not checked for it).
    """

    task_id: int
    state: str
    lease_token: int
    events: Sequence[HistoryEvent] = ()
    evidence: Sequence[HistoryEvidence] = ()
    tenant: str | None = None


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken invariant in one task's history.

    Attributes:
        task_id: the task.
        kind: which invariant.
        message: what was found, naming the records by table and id.
        token: the fencing token at fault, when there is one.
        record: the offending row as ``"event ID"`` or ``"evidence ID"``; None when the
            fault is an absence (e.g. no terminal event).
        occurrence: the effect occurrence, for evidence faults.
    """

    task_id: int
    kind: ViolationKind
    message: str
    token: int | None = None
    record: str | None = None
    occurrence: str | None = None

    def __str__(self) -> str:
        return f"task {self.task_id}: {self.kind}: {self.message}"


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """The result of :func:`audit_all`.

    Attributes:
        tasks_checked: tasks whose history was read and checked.
        violations: every violation found, by task id then check.
        unknown_tasks: ids asked for that have no task row (not counted as checked).
    """

    tasks_checked: int
    violations: tuple[Violation, ...] = ()
    unknown_tasks: tuple[int, ...] = ()

    @property
    def by_kind(self) -> dict[ViolationKind, int]:
        """Number of violations of each kind, every kind present (zero included)."""
        counts = collections.Counter(v.kind for v in self.violations)
        return {kind: counts.get(kind, 0) for kind in ViolationKind}

    @property
    def stale_token_commits(self) -> int:
        """Records committed under a token after a higher token was issued."""
        return self.by_kind[ViolationKind.STALE_TOKEN_COMMIT]

    @property
    def ok(self) -> bool:
        """True when no history breaks an invariant."""
        return not self.violations

    def summary(self) -> str:
        """One line: tasks checked, then violations by kind."""
        kinds = ", ".join(f"{kind} {n}" for kind, n in self.by_kind.items())
        return (
            f"audit: {counted(self.tasks_checked, 'task')} checked, "
            f"{counted(len(self.violations), 'violation')} "
            f"({kinds})"
        )


# --- reading histories ------------------------------------------------------------------------


def _database(source: Store | Database) -> Database:
    return source.db if isinstance(source, Store) else source


async def _fetch(
    conn: psycopg.AsyncConnection[Any], name: str, row: type[_Row], params: dict[str, Any]
) -> list[_Row]:
    cursor = conn.cursor(row_factory=class_row(row))
    await cursor.execute(query(name), params)
    return await cursor.fetchall()


@dataclasses.dataclass(frozen=True)
class _TaskRow:
    id: int
    tenant: str
    state: str
    lease_token: int


async def load_histories(source: Store | Database, task_ids: Sequence[int]) -> list[TaskHistory]:
    """Read the histories of ``task_ids`` in one read-only snapshot.

    Args:
        source: an open store, or its database.
        task_ids: the tasks; ids without a task row are left out.

    Returns:
        One history per existing task, in id order.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
        StoreError: the database refused a read (e.g. the schema is missing).
    """
    params = {"task_ids": list(task_ids)}
    async with _database(source).transaction() as conn:
        await conn.execute(query("audit_snapshot"))
        tasks = await _fetch(conn, "audit_tasks", _TaskRow, params)
        events = await _fetch(conn, "audit_events", HistoryEvent, params)
        evidence = await _fetch(conn, "audit_evidence", HistoryEvidence, params)
    events_of: dict[int, list[HistoryEvent]] = collections.defaultdict(list)
    for event in events:
        events_of[event.task_id].append(event)
    evidence_of: dict[int, list[HistoryEvidence]] = collections.defaultdict(list)
    for record in evidence:
        evidence_of[record.task_id].append(record)
    return [
        TaskHistory(
            task_id=task.id,
            state=task.state,
            lease_token=task.lease_token,
            events=tuple(events_of[task.id]),
            evidence=tuple(evidence_of[task.id]),
            tenant=task.tenant,
        )
        for task in tasks
    ]


async def audit_task(source: Store | Database, task_id: int) -> list[Violation]:
    """Check one task's stored history against the fencing invariants.

    Reads only; safe while workers run (one read-only snapshot).

    Args:
        source: an open store, or its database.
        task_id: the task.

    Returns:
        The violations found; empty for a sound history.

    Raises:
        UnknownTask: no task has that id.
        DatabaseUnavailable: the database cannot be reached.
    """
    histories = await load_histories(source, [task_id])
    if not histories:
        raise UnknownTask(f"no task {task_id}")
    return check_history(histories[0])


async def audit_all(
    source: Store | Database,
    *,
    task_ids: Iterable[int] | None = None,
    page_size: int = 500,
) -> AuditReport:
    """Check the histories of many tasks (default: every task in the store).

    Tasks are read ``page_size`` at a time, each page in one read-only snapshot, so memory
    stays bounded and no long transaction holds back vacuum.

    Args:
        source: an open store, or its database.
        task_ids: the tasks to check; None for all of them.
        page_size: tasks per read, at least 1.

    Returns:
        Tasks checked, every violation, and the asked-for ids that have no task.

    Raises:
        ValueError: ``page_size`` is below 1.
        DatabaseUnavailable: the database cannot be reached.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, not {page_size}")
    db = _database(source)
    checked = 0
    violations: list[Violation] = []
    unknown: list[int] = []
    async for page in _pages(db, task_ids, page_size):
        histories = await load_histories(db, page)
        found = {history.task_id for history in histories}
        unknown.extend(task_id for task_id in page if task_id not in found)
        checked += len(histories)
        for history in histories:
            violations.extend(check_history(history))
    return AuditReport(checked, tuple(violations), tuple(unknown))


async def _pages(
    db: Database, task_ids: Iterable[int] | None, size: int
) -> AsyncIterator[list[int]]:
    """Yield lists of at most ``size`` task ids: the given ones, or every task's."""
    if task_ids is not None:
        wanted = sorted(set(task_ids))
        for start in range(0, len(wanted), size):
            yield wanted[start : start + size]
        return
    after = 0
    while True:
        rows = await db.fetch_all("audit_task_page", {"after": after, "limit": size})
        if not rows:
            return
        page = [int(row["id"]) for row in rows]
        yield page
        after = page[-1]


# --- checking one history ---------------------------------------------------------------------


def check_history(history: TaskHistory) -> list[Violation]:
    """Check one history against the invariants (pure: no database).

    Args:
        history: the task row's state and token, its events and evidence in id order.

    Returns:
        The violations, in the order of the checks: claims, records, starts, terminal,
        tenants.
    """
    claims = [event for event in history.events if event.kind in CLAIM_KINDS]
    found = _check_claims(history, claims)
    record_faults = _check_records(history, claims)
    found.extend(record_faults)
    found.extend(_check_double_starts(history, claims))
    flagged = {v.record for v in record_faults}
    found.extend(_check_terminal(history, claims, flagged))
    found.extend(_check_tenants(history))
    return found


def _check_tenants(history: TaskHistory) -> list[Violation]:
    """Every record carries the task's tenant (when both are known)."""
    if history.tenant is None:
        return []
    records = [(f"event {e.id}", e.tenant) for e in history.events]
    records += [(f"evidence {e.id}", e.tenant) for e in history.evidence]
    return [
        _violation(
            history,
            ViolationKind.TENANT_MISMATCH,
            f"{where} is stored under tenant {tenant!r}, its task under {history.tenant!r}",
            record=where,
        )
        for where, tenant in records
        if tenant is not None and tenant != history.tenant
    ]


def _violation(history: TaskHistory, kind: ViolationKind, message: str, **facts: Any) -> Violation:
    return Violation(task_id=history.task_id, kind=kind, message=message, **facts)


def _check_claims(history: TaskHistory, claims: Sequence[HistoryEvent]) -> list[Violation]:
    """Tokens issued by claims rise by one each; the task row holds the last one."""
    found: list[Violation] = []
    highest = 0
    for claim in claims:
        token = claim.fencing_token
        where = f"event {claim.id}"
        if token is None:
            found.append(
                _violation(
                    history, ViolationKind.TOKEN_NOT_INCREASING,
                    f"{claim.kind} event {claim.id} issued no token", record=where,
                )
            )  # fmt: skip
            continue
        if token <= highest:
            found.append(
                _violation(
                    history, ViolationKind.TOKEN_NOT_INCREASING,
                    f"{claim.kind} event {claim.id} issued token {token} after token {highest}",
                    token=token, record=where,
                )
            )  # fmt: skip
        elif token > highest + 1:
            found.append(
                _violation(
                    history, ViolationKind.TOKEN_SKIPPED,
                    f"{claim.kind} event {claim.id} issued token {token}; the last claim "
                    f"issued {highest}", token=token, record=where,
                )
            )  # fmt: skip
        highest = max(highest, token)
    found.extend(_check_row_token(history, highest))
    return found


def _check_row_token(history: TaskHistory, highest: int) -> list[Violation]:
    """The task row's token is the highest one its claims issued."""
    row = history.lease_token
    if row > highest:
        message = f"the task holds token {row} but its claims issued up to {highest}"
        return [_violation(history, ViolationKind.TOKEN_SKIPPED, message, token=row)]
    if row < highest:
        message = f"the task holds token {row} below token {highest} already issued"
        return [_violation(history, ViolationKind.TOKEN_NOT_INCREASING, message, token=row)]
    return []


class _Issued:
    """The tokens the claims of one history had issued by any point of it (bisection).

    Events are placed by id among the claims (one sequence); evidence by database time.
    """

    def __init__(self, claims: Sequence[HistoryEvent]) -> None:
        self._by_id = list(claims)  # claims come in id order
        self._ids = [claim.id for claim in self._by_id]
        self._by_time = sorted(claims, key=lambda claim: (claim.at, claim.id))
        self._times = [claim.at for claim in self._by_time]

    def before_event(self, event_id: int) -> Sequence[HistoryEvent]:
        """Claims inserted before event ``event_id``."""
        return self._by_id[: bisect.bisect_left(self._ids, event_id)]

    def by_time(self, at: datetime.datetime, *, strictly: bool) -> Sequence[HistoryEvent]:
        """Claims recorded before ``at`` (or at the same instant, unless ``strictly``)."""
        cut = (bisect.bisect_left if strictly else bisect.bisect_right)(self._times, at)
        return self._by_time[:cut]


def _check_records(history: TaskHistory, claims: Sequence[HistoryEvent]) -> list[Violation]:
    """Every token-carrying event and evidence record: issued token, not superseded."""
    issued = _Issued(claims)
    found: list[Violation] = []
    for event in history.events:
        if event.kind in CLAIM_KINDS or event.fencing_token is None:
            continue
        before = issued.before_event(event.id)
        what = f"{event.kind} event {event.id}"
        fault = _token_fault(history, what, event.fencing_token, before, f"event {event.id}")
        if fault is not None:
            found.append(fault)
    for record in history.evidence:
        what = f"{record.record} evidence {record.id} of {record.occurrence}"
        fault = _token_fault(
            history, what, record.fencing_token,
            issued.by_time(record.recorded_at, strictly=False), f"evidence {record.id}",
            superseding=issued.by_time(record.recorded_at, strictly=True),
            occurrence=record.occurrence,
        )  # fmt: skip
        if fault is not None:
            found.append(fault)
    return found


def _token_fault(
    history: TaskHistory,
    what: str,
    token: int,
    issued: Sequence[HistoryEvent],
    where: str,
    *,
    superseding: Sequence[HistoryEvent] | None = None,
    occurrence: str | None = None,
) -> Violation | None:
    """The fault of a record under ``token``, given the claims before it; None if sound.

    ``issued`` are the claims recorded before it (token issued by then); ``superseding``,
    default ``issued``, those that could have made it stale.
    """
    highest = max((claim.fencing_token or 0 for claim in issued), default=0)
    if token > highest:
        return _violation(
            history, ViolationKind.UNISSUED_TOKEN,
            f"{what} carries token {token}; the highest issued by then was {highest}",
            token=token, record=where, occurrence=occurrence,
        )  # fmt: skip
    candidates = issued if superseding is None else superseding
    newer = next((c for c in candidates if (c.fencing_token or 0) > token), None)
    if newer is None:
        return None
    return _violation(
        history, ViolationKind.STALE_TOKEN_COMMIT,
        f"{what} was recorded under token {token} after {newer.kind} event {newer.id} "
        f"issued token {newer.fencing_token}",
        token=token, record=where, occurrence=occurrence,
    )  # fmt: skip


def _check_double_starts(history: TaskHistory, claims: Sequence[HistoryEvent]) -> list[Violation]:
    """A non-idempotent occurrence is started again only after an answer to the last start.

    An answer is a ``failed`` record (the call's outcome is known), a record by an operator
    (a writer that never claimed the task), or a ``reconciled`` event for the occurrence
    recorded between the two starts. A worker's ``completed`` record is no licence to start
    again: the effect is done.
    """
    claimers = {claim.worker_id for claim in claims}
    by_occurrence: dict[str, list[HistoryEvidence]] = collections.defaultdict(list)
    for record in history.evidence:
        if not record.idempotent:
            by_occurrence[record.occurrence].append(record)
    found: list[Violation] = []
    for occurrence, records in by_occurrence.items():
        open_start: HistoryEvidence | None = None
        answered = False
        for record in records:
            if record.record != "started":
                operator = record.worker_id not in claimers
                answered = answered or record.record == "failed" or operator
                continue
            if open_start is not None and not answered:
                if not _reconciled_between(history, occurrence, open_start, record):
                    found.append(_double_start(history, occurrence, open_start, record))
            open_start, answered = record, False
    return found


def _reconciled_between(
    history: TaskHistory, occurrence: str, first: HistoryEvidence, second: HistoryEvidence
) -> bool:
    return any(
        event.kind == "reconciled"
        and event.occurrence == occurrence
        and first.recorded_at <= event.at <= second.recorded_at
        for event in history.events
    )


def _double_start(
    history: TaskHistory, occurrence: str, first: HistoryEvidence, second: HistoryEvidence
) -> Violation:
    return _violation(
        history, ViolationKind.DOUBLE_START,
        f"non-idempotent {occurrence} was started again (evidence {second.id}, token "
        f"{second.fencing_token}) with no outcome or reconciliation since evidence "
        f"{first.id} (token {first.fencing_token})",
        token=second.fencing_token, record=f"evidence {second.id}", occurrence=occurrence,
    )  # fmt: skip


def _check_terminal(
    history: TaskHistory, claims: Sequence[HistoryEvent], flagged: set[str | None]
) -> list[Violation]:
    """A terminal task's last terminal event matches its state and carries its last token."""
    if history.state not in TERMINAL:
        return []
    final = next((e for e in reversed(history.events) if e.kind in TERMINAL), None)
    if final is None:
        message = f"the task is {history.state} but has no terminal event"
        return [_violation(history, ViolationKind.TERMINAL_WRITE, message)]
    where = f"event {final.id}"
    if where in flagged:
        return []  # already reported as a stale or unissued token
    fault = _terminal_fault(history, claims, final)
    if fault is None:
        return []
    return [
        _violation(
            history, ViolationKind.TERMINAL_WRITE, fault,
            token=final.fencing_token, record=where,
        )
    ]  # fmt: skip


def _terminal_fault(
    history: TaskHistory, claims: Sequence[HistoryEvent], final: HistoryEvent
) -> str | None:
    if final.kind != history.state:
        return f"the task is {history.state} but its last terminal event {final.id} is {final.kind}"
    if final.fencing_token is None:
        if final.kind == "cancelled":
            # A direct cancel of a task no worker held: `toolkit cancel` (no writer) or a
            # bulk cancel (its operator); a worker's terminal write always has a token.
            return None
        return f"{final.kind} event {final.id} by {final.worker_id} carries no token"
    last = max([history.lease_token, *(c.fencing_token or 0 for c in claims)])
    if final.fencing_token != last:
        return (
            f"{final.kind} event {final.id} carries token {final.fencing_token}, not the "
            f"task's last token {last}"
        )
    return None
