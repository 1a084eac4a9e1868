"""What a task or a branch waits for: the ``wait`` part of a checkpoint (DESIGN §2).

One typed value per kind of wait, each with its stored JSON form (``to_json``) and
:func:`wait_from_json` to read any of them back. The SQL reads parts of it
(``checkpoint -> 'wait'``); a change of that JSON is a new checkpoint format
(:data:`toolkit.checkpoint.CHECKPOINT_FORMAT`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

Json = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TimerWait:
    """A durable timer of step occurrence ``occurrence`` (reason ``timer``)."""

    occurrence: str

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"occurrence": self.occurrence, "timer": True}


@dataclasses.dataclass(frozen=True)
class SignalWait:
    """A wait for signal ``signal`` (reason ``signal``), with or without a timeout."""

    occurrence: str
    signal: str

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"occurrence": self.occurrence, "signal": self.signal}


@dataclasses.dataclass(frozen=True)
class AnyWait:
    """``wait: {any}``: the first of ``signals`` or of the timers decides where to go.

    The reason is ``signal`` (or ``timer`` with no signal); ``timer`` is the index among the
    step's timers of the earliest one, whose moment is the task's ``run_at`` (None when the
    step has no timer).
    """

    occurrence: str
    signals: tuple[str, ...]
    timer: int | None = None

    def to_json(self) -> Json:
        """The stored JSON form."""
        data: Json = {"occurrence": self.occurrence, "signals": list(self.signals), "any": True}
        if self.timer is not None:
            data["timer"] = self.timer
        return data


@dataclasses.dataclass(frozen=True)
class CallbackWait:
    """The completion of callback token ``callback`` of an effect occurrence."""

    occurrence: str
    callback: str

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"occurrence": self.occurrence, "callback": self.callback}


@dataclasses.dataclass(frozen=True)
class ChildWait:
    """The end of child task ``child`` started by a ``workflow`` step occurrence."""

    occurrence: str
    child: int

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"occurrence": self.occurrence, "child": self.child}


@dataclasses.dataclass(frozen=True)
class BudgetWait:
    """Room for the reservation of a parallel or map step occurrence.

    ``deferrals``: how many in a row so far (the next look is later each time).
    """

    occurrence: str
    deferrals: int

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"occurrence": self.occurrence, "budget": self.deferrals}


@dataclasses.dataclass(frozen=True)
class LimitWait:
    """A slot or token of downstream limit ``limit`` in ``scope`` (``""`` or the tenant).

    ``deferrals``: how many in a row, the first at ``since`` (ISO-8601, database time).
    """

    occurrence: str
    limit: str
    scope: str
    deferrals: int
    since: str | None

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {
            "occurrence": self.occurrence, "limit": self.limit, "scope": self.scope,
            "deferrals": self.deferrals, "since": self.since,
        }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class BranchesWait:
    """Every live branch of parallel or map step occurrence ``occurrence`` waits."""

    occurrence: str

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {"occurrence": self.occurrence, "branches": True}


@dataclasses.dataclass(frozen=True)
class MapItemsWait:
    """How far distributed map step occurrence ``occurrence`` has come (reason ``map``).

    Kept from its first page on, waiting or not: ``cursor`` is the item source's cursor of
    the next page (None before the first), ``listed`` the items listed so far (the index of
    the next), ``tasks`` the child tasks started, ``listing`` whether pages remain,
    ``attempts`` the failed calls in a row for the next page (an effect source's retries),
    ``checks`` how many times the children were counted since, ``pages`` the pages listed,
    and ``version`` the version of the children's definition, pinned at the first page.
    """

    occurrence: str
    cursor: Any = None
    listed: int = 0
    tasks: int = 0
    listing: bool = True
    attempts: int = 0
    checks: int = 0
    pages: int = 0
    version: int | None = None

    def to_json(self) -> Json:
        """The stored JSON form."""
        return {
            "occurrence": self.occurrence,
            "map": {"cursor": self.cursor, "listed": self.listed, "tasks": self.tasks,
                    "listing": self.listing, "attempts": self.attempts,
                    "checks": self.checks, "pages": self.pages, "version": self.version},
        }  # fmt: skip


Wait = (
    TimerWait | SignalWait | AnyWait | CallbackWait | ChildWait | BudgetWait | LimitWait
    | BranchesWait | MapItemsWait
)


def wait_from_json(data: Mapping[str, Any] | None) -> Wait | None:
    """The wait a checkpoint's ``wait`` JSON describes (None for none).

    Raises:
        ValueError: the JSON is no known wait.
    """
    if not data:
        return None
    occurrence = str(data.get("occurrence"))
    if data.get("any"):
        timer = data.get("timer")
        return AnyWait(occurrence, tuple(data.get("signals") or ()), timer)
    if "signal" in data:
        return SignalWait(occurrence, data["signal"])
    if "callback" in data:
        return CallbackWait(occurrence, data["callback"])
    if "child" in data:
        return ChildWait(occurrence, int(data["child"]))
    if "budget" in data:
        return BudgetWait(occurrence, int(data["budget"]))
    if "limit" in data:
        return LimitWait(
            occurrence, data["limit"], data.get("scope") or "", int(data.get("deferrals", 0)),
            data.get("since"),
        )  # fmt: skip
    if data.get("branches"):
        return BranchesWait(occurrence)
    if isinstance(data.get("map"), Mapping):
        m = data["map"]
        return MapItemsWait(
            occurrence, m.get("cursor"), int(m.get("listed", 0)), int(m.get("tasks", 0)),
            bool(m.get("listing", True)), int(m.get("attempts", 0)), int(m.get("checks", 0)),
            int(m.get("pages", 0)), m.get("version"),
        )  # fmt: skip
    if data.get("timer"):
        return TimerWait(occurrence)
    raise ValueError(f"unknown wait in a checkpoint: {dict(data)!r}")
