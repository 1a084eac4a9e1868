"""What effects spend of budgeted resources, as calls report it (``ctx.spend``).

Budgets, reservations and branch shares are pools; calls of one cycle running at once
(branches of a parallel or map step) share them, so a call's room is its pool's rest less
what the others have reported and not yet been charged.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Mapping

from toolkit.errors import BudgetExceeded

#: Where a spend limit applies: a key naming the counter several calls may share (the
#: task's budget of a resource, a step's total reservation, one branch's share of it).
Pool = Hashable
#: What the calls of a cycle may still spend, by resource: ``(pool, amount)``.
SpendLimits = Mapping[str, tuple[Pool, float]]


class SpendLedger:
    """The spend that concurrent calls of one cycle reported and that is not charged yet.

    Branches of a parallel or map step run their calls at once against the same budget: a
    call's limit is what remains of its pool less what the other calls of that pool have
    reported meanwhile, so together they never spend past it. ``lock`` also covers the
    charge that moves a call's spend out of the ledger (see `SpendMeter.settle`).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()  # sync handlers report from their worker threads
        self.in_flight: dict[Pool, dict[int, float]] = {}

    def others(self, pool: Pool, meter: SpendMeter) -> float:
        """What the other calls of ``pool`` reported and is not charged yet."""
        return sum(v for m, v in self.in_flight.get(pool, {}).items() if m != id(meter))


class SpendMeter:
    """What one effect call spends, against what remains of its pools (DESIGN §2-3).

    Args:
        limits: the pools and amounts the call may use now, read at each report (absent
            resource: no limit).
        ledger: the cycle's in-flight spend, shared by its concurrent calls.
    """

    def __init__(self, limits: Callable[[], SpendLimits], ledger: SpendLedger) -> None:
        self._limits = limits
        self._ledger = ledger
        self.spent: dict[str, float] = {}

    def add(self, amounts: Mapping[str, float]) -> None:
        """Record ``amounts``; raise once one is over what remains (see `EffectContext.spend`).

        Raises:
            BudgetExceeded: over what remained for the call (the amounts are recorded).
            ValueError: a negative, infinite or non-numeric amount (nothing recorded).
        """
        for resource, amount in amounts.items():
            if (
                isinstance(amount, bool)
                or not isinstance(amount, int | float)
                or not math.isfinite(amount)
                or amount < 0
            ):
                raise ValueError(
                    f"spend of {resource!r} must be a finite number >= 0, got {amount!r}"
                )
        over = None
        with self._ledger.lock:
            limits = self._limits()
            for resource, amount in amounts.items():
                total = self.spent.get(resource, 0.0) + float(amount)
                self.spent[resource] = total
                if resource not in limits:
                    continue
                pool, limit = limits[resource]
                left = limit - self._ledger.others(pool, self)
                self._ledger.in_flight.setdefault(pool, {})[id(self)] = total
                if total > left + 1e-9 and over is None:
                    over = (resource, total, left)
        if over is not None:
            resource, total, left = over
            raise BudgetExceeded(
                f"spending {total:g} {resource} exceeds the {max(left, 0):g} that remained of "
                "the budget",
                resource=resource, wanted=total, remaining=left,
            )  # fmt: skip

    def settle(self, charge: Callable[[dict[str, float]], None] | None = None) -> None:
        """Leave the ledger, charging the spend with ``charge`` at the same moment.

        So no other call counts it twice or not at all. Without ``charge`` (the call was
        abandoned), the spend is dropped with the call.
        """
        with self._ledger.lock:
            if charge is not None and self.spent:
                charge(dict(self.spent))
            for calls in self._ledger.in_flight.values():
                calls.pop(id(self), None)
