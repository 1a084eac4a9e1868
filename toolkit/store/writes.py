"""What one fenced write of a task carries (DESIGN §2, §4): the values of a write.

A :class:`FencedWrite` holds a task's next checkpoint and state, the effect evidence and
events to append, the signals it consumes and its budget changes; it is applied only while
its :class:`~toolkit.store.fence.Fence` holds (``Leases.commit``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson
from psycopg.types.json import Jsonb

from toolkit.lifecycle import EventKind, TaskState, WaitReason
from toolkit.store.fence import Fence

#: The ``run_at`` of a wait with no deadline: later than any real time, yet a value Python's
#: ``datetime`` can hold (PostgreSQL's ``'infinity'`` cannot be loaded into one).
NEVER = "9999-12-31T00:00:00+00:00"


@dataclasses.dataclass(slots=True)
class EvidenceRecord:
    """One effect evidence record to append (``started``, ``completed`` or ``failed``).

    Not changed once made, though not frozen: a frozen dataclass is five times as costly to
    make, and one is made for every outcome (docs/decisions.md, issue 22).

    ``limited``: the call took downstream-limit slots, which a ``completed`` or ``failed``
    record releases (docs/limits.md); True unless the caller knows it took none.
    """

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
    limited: bool = True

    @property
    def releases_slots(self) -> bool:
        """Whether writing this record releases downstream-limit slots of its occurrence."""
        return self.limited and self.record != "started"


@dataclasses.dataclass(frozen=True)
class Event:
    """One task event to append (the history of transitions)."""

    kind: EventKind
    detail: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class BranchRow:
    """One branch of a parallel or map step, as a write stores it (``toolkit_branches``).

    Attributes:
        fanout: the step's occurrence (``"fan#1"``).
        name: the branch's name, or a map item's index as text.
        position: the branch's order among the step's branches.
        status: where it stands (a ``BranchStatus`` value).
        frame: its progress, JSON (``BranchFrame.to_json``).
        run_at: when a waiting branch's wait ends at the latest (ISO-8601, database time);
            None for none.
        waits_for: what a waiting branch waits for (``signal:NAME``, ``callback:TOKEN``,
            ``child:ID``).
        seen: the branch's wakes handled so far (see migration 0012).
    """

    fanout: str
    name: str
    position: int
    status: str
    frame: Mapping[str, Any]
    run_at: str | None = None
    waits_for: Sequence[str] = ()
    seen: int = 0


@dataclasses.dataclass(slots=True)
class FencedWrite:
    """Everything one fenced statement writes for one task.

    Not changed once made, though not frozen (as an `EvidenceRecord`).

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
        tags: tags to set on the task (``ctx.tag`` of the handlers whose evidence this
            write carries). None: nothing.
        branches: branch rows to store (each replaces the stored row of its branch).
        branches_ended: occurrences of parallel or map steps that ended: their branch rows
            are deleted (none of ``branches`` belongs to one).
        ends_child: the write ends a child task (a ``workflow`` step's): a branch of its
            parent waiting for it is woken in the same transaction.
        trace_attempt: the W3C traceparent of the span of the attempt (cycle) writing, on its
            first write with tracing on (docs/tracing.md); None: unchanged.

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
    tags: Mapping[str, str] | None = None
    branches: Sequence[BranchRow] = ()
    branches_ended: Sequence[str] = ()
    ends_child: bool = False
    trace_attempt: str | None = None


def writes_param(writes: Sequence[FencedWrite], *, lean: bool = False) -> Jsonb:
    """The ``writes`` parameter of the fenced-write statements: the writes as one JSON array.

    Encoded by orjson, about ten times as fast as the standard library's encoder on a
    write (10 µs against 1 µs each, docs/decisions.md, "The writes are encoded by orjson"),
    with the same text but for spacing. A value orjson refuses and the standard encoder
    takes (an integer past 64 bits, a key that is not a string, a lone surrogate) is encoded
    by the standard encoder, so a write sends what it sent before.

    Args:
        writes: the fenced writes of one statement.
        lean: they go by ``commit_step``, which refers back an end that does more than its
            task's row (writes.sql).

    Returns:
        A psycopg ``Jsonb`` wrapper of the list of :func:`write_json` objects.
    """
    return Jsonb([write_json(write, lean=lean) for write in writes], dumps=_encoded)


def _encoded(value: Any) -> bytes | str:
    """``value`` as JSON text: orjson's, or the standard encoder's for what orjson refuses."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value)


def write_json(write: FencedWrite, *, lean: bool = False) -> dict[str, Any]:
    """The write as one element of ``commit_fenced``'s ``writes`` parameter (JSON).

    Args:
        write: the fenced write.
        lean: it goes by ``commit_step`` (see :func:`writes_param`).
    """
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
        "tags": write.tags,
        "trace_attempt": write.trace_attempt,
        "branches": [
            {
                "fanout": b.fanout, "name": b.name, "position": b.position, "status": b.status,
                "frame": b.frame, "run_at": b.run_at, "waits_for": list(b.waits_for),
                "seen": b.seen,
            }
            for b in write.branches
        ],
        "branches_ended": list(write.branches_ended),
        "lean": lean,
    }
