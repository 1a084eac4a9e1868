"""A task's lifecycle as closed sets of names: its states, why it waits, what it records.

DESIGN §2; the state diagram in docs/concepts.md.

The values are the strings stored in ``toolkit_tasks.state``, ``wait_reason`` and
``toolkit_task_events.kind`` (and, not stored, what happened to each step of a task:
``StepStatus``); each enum is a ``str``, so a member is usable wherever the string is (JSON,
SQL parameters, comparisons).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any


class TaskState(enum.StrEnum):
    """Where a task is; ``succeeded``, ``failed`` and ``cancelled`` are terminal."""

    QUEUED = "queued"
    LEASED = "leased"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the task has ended."""
        return self in TERMINAL_STATES

    def phrase(self, wait_reason: str | None = None) -> str:
        """The state as a sentence's verb: ``has succeeded``, ``is waiting (signal)`` ...

        Args:
            wait_reason: why a ``waiting`` task waits, shown in brackets.
        """
        if self.terminal:
            return "was cancelled" if self is TaskState.CANCELLED else f"has {self.value}"
        if self is TaskState.LEASED:
            return "is running (leased)"
        return f"is {self.value}{f' ({wait_reason})' if wait_reason else ''}"


TERMINAL_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED})


def cursor_text(cursor: object, state: str) -> str:
    """A checkpoint's cursor for people: the step, or why there is none.

    Args:
        cursor: the checkpoint's ``cursor`` (None before the first step and after the last).
        state: the task's state.
    """
    if cursor is not None:
        return str(cursor)
    return "(ended)" if state in TERMINAL_STATES else "(not started)"


def received_signal(wait: Mapping[str, Any], signals: Iterable[Mapping[str, Any]]) -> str | None:
    """The name of a signal the wait takes that was sent and not consumed yet, or None.

    Such a task is due (a signal for a name it waits for makes it due at once) and only
    waits for a worker to claim it.

    Args:
        wait: a waiting task's checkpoint ``wait`` (``signal``, or the ``signals`` of an
            ``any`` wait).
        signals: the task's signals (``store.tasks.signals``), each with ``name`` and
            ``consumed_at``.
    """
    names = [wait["signal"]] if "signal" in wait else list(wait.get("signals") or ())
    for signal in signals:
        if signal["name"] in names and signal["consumed_at"] is None:
            return str(signal["name"])
    return None


def received_text(name: str, occurrence: str | None = None) -> str:
    """A wait whose signal ``name`` came, in words: due, waiting only for a worker.

    Args:
        name: the signal's name.
        occurrence: the wait step's occurrence (``approve#1``), named when given.
    """
    at = f" at {occurrence}" if occurrence else ""
    return f"signal {name!r}{at} received; due now, waiting for a worker"


class WaitReason(enum.StrEnum):
    """Why a ``waiting`` task waits (it always has one), and what ends the wait."""

    #: a durable timer (``wait: {duration | until}``, or the timers of ``wait: {any}``).
    TIMER = "timer"
    #: a signal (``wait: {signal}``, or the signals of ``wait: {any}``), or its timeout.
    SIGNAL = "signal"
    #: the completion of an effect's callback token, or its timeout.
    CALLBACK = "callback"
    #: a child workflow's end.
    CHILD = "child"
    #: room in the tenant's budget for a step's reservation.
    BUDGET = "budget"
    #: a slot or token of a downstream limit.
    LIMIT = "limit"
    #: an operator's record of an uncertain non-idempotent effect's outcome.
    RECONCILIATION = "reconciliation"
    #: a delayed start (``submit --at`` / ``--delay``): the task starts at its ``run_at``.
    START = "start"
    #: every live branch of a parallel or map step waits (a timer, signal, callback or
    #: child each); ``run_at`` is the earliest branch timer, and any branch's wake ends it.
    BRANCHES = "branches"
    #: the definition's concurrency key (``concurrency:``) has ``max_active`` live holders:
    #: the task is admitted, in submission order, when one ends (docs/flow-control.md).
    CONCURRENCY = "concurrency"
    #: a debounced submit (``debounce:``): the task starts at its ``run_at`` unless another
    #: submit of its key moves that on (taking the new input), up to ``max_wait``.
    DEBOUNCE = "debounce"
    #: the child tasks of a distributed map step (``map: {distributed: true}``) run; the
    #: task counts them at intervals, and goes on once none is live.
    MAP = "map"


class EventKind(enum.StrEnum):
    """The kinds of task events, the history of a task's transitions (docs/history.md)."""

    # written by the store: submission, claims, requests from outside
    SUBMITTED = "submitted"
    CLAIMED = "claimed"
    RECOVERED = "recovered"
    SIGNAL_RECEIVED = "signal_received"
    CALLBACK_COMPLETED = "callback_completed"
    CANCEL_REQUESTED = "cancel_requested"
    RECONCILED = "reconciled"
    #: an operator brought a failed, cancelled or timed-out task back (``toolkit redrive``)
    REDRIVEN = "redriven"
    BUDGET_RESERVED = "budget_reserved"
    #: the task took its concurrency key (``concurrency:``) and may now be claimed
    KEY_ADMITTED = "key_admitted"
    #: a later submit of the task's debounce key replaced its input before it started
    DEBOUNCED = "debounced"
    # written by the interpreter, with its fenced writes
    WAITING = "waiting"
    RETRY_SCHEDULED = "retry_scheduled"
    ATTEMPT_LOST = "attempt_lost"
    RECONCILIATION_REQUIRED = "reconciliation_required"
    CAUGHT = "caught"
    RELEASED = "released"
    DEADLINE_PASSED = "deadline_passed"
    LIMIT_DEFERRED = "limit_deferred"
    BUDGET_DEFERRED = "budget_deferred"
    FANOUT_STARTED = "fanout_started"
    BRANCH_SUCCEEDED = "branch_succeeded"
    BRANCH_FAILED = "branch_failed"
    BRANCH_CANCELLED = "branch_cancelled"
    RACE_WON = "race_won"
    FANOUT_ENDED = "fanout_ended"
    CHILD_STARTED = "child_started"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    # the end of a task (by the interpreter, or by the store for a cancel)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepStatus(enum.StrEnum):
    """What happened to one step of a definition in one task: its colour on the task's path.

    `toolkit.history.task_path` says it for each step; `toolkit.definition.svg` colours the
    definition's drawing by it.
    """

    #: entered and finished (its latest occurrence completed).
    DONE = "done"
    #: the task's cursor: the next step to run, or running now (or where it was cancelled).
    CURRENT = "current"
    #: it failed the task, or failed and a ``catch`` rule took the task on, or the workflow
    #: deadline abandoned it for ``on_timeout``, or its compensation failed.
    FAILED = "failed"
    #: the task waits at it (a signal, timer, callback, child, budget, limit or
    #: reconciliation).
    WAITING = "waiting"
    #: it completed, then a saga compensation undid it.
    COMPENSATED = "compensated"
    #: the task has not entered it.
    NOT_REACHED = "not_reached"
