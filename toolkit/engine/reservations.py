"""Budget reservations of parallel and map steps (DESIGN §2, docs/composition.md).

A step's reservation is taken from the task's budget and its tenant's before any branch
starts, atomically with the checkpoint that records it; if it does not fit now the task
waits (reason ``budget``), if it can never fit the step fails with ``BudgetExceeded``. What
the branches do not spend returns when the step ends, or the task is cancelled.
"""

from __future__ import annotations

import functools

from toolkit.checkpoint import FanOut
from toolkit.definition import MapStep, ParallelStep
from toolkit.engine.cycle import Cycle
from toolkit.engine.protocol import Failed, Wait
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.store.budgets import ReservationOutcome
from toolkit.store.writes import Event
from toolkit.waits import BudgetWait

#: Longest pause before a task deferred for budget looks again, seconds.
BUDGET_RECHECK_MAX = 60.0


async def reserve(
    cycle: Cycle, step: ParallelStep | MapStep, fan: FanOut, branches: int
) -> Failed | Wait | None:
    """Take the step's reservation from the task's and the tenant's budgets.

    Returns:
        None once reserved; a wait (reason ``budget``, looking again later) when it does
        not fit now; the step's failure with ``BudgetExceeded`` when it can never fit.
    """
    assert step.reserve is not None
    cp = cycle.checkpoint
    factor = branches if step.reserve.per_branch else 1
    amounts = {res: float(amount) * factor for res, amount in step.reserve.amounts.items()}
    for resource, amount in amounts.items():
        line = cp.budget.get(resource)
        if line is not None and amount > line.limit - line.spent + 1e-9:
            return refused(cycle, step, resource, amount, line.limit - line.spent, "task")
    if cycle.dirty:
        await cycle.commit()  # the reservation's own write carries no evidence
    fan.reserved = amounts
    for resource, amount in amounts.items():
        if resource in cp.budget:
            cp.budget[resource].reserved += amount
    deferrals = cp.wait.deferrals if isinstance(cp.wait, BudgetWait) else 0
    cp.wait = None
    async with cycle.lock:
        outcome, short = await cycle.retrying(
            functools.partial(
                cycle.services.store.budgets.reserve, cycle.fence, amounts,
                cycle.checkpoint_json(), cycle.next_write_id(),
                {"step": step.id, "amounts": amounts},
            )
        )  # fmt: skip
    if outcome is ReservationOutcome.RESERVED:
        return None
    fan.reserved = None
    for resource, amount in amounts.items():
        if resource in cp.budget:
            cp.budget[resource].reserved -= amount
    assert short is not None
    if outcome is ReservationOutcome.NEVER:
        return refused(cycle, step, short, amounts[short], None, "tenant")
    delay = min(BUDGET_RECHECK_MAX, 2.0 ** min(deferrals + 1, 6))
    event = Event(
        EventKind.BUDGET_DEFERRED,
        {"step": step.id, "resource": short, "amount": amounts[short], "delay_seconds": delay},
    )
    return Wait(
        WaitReason.BUDGET, BudgetWait(fan.occurrence, deferrals + 1), event, delay_seconds=delay
    )


def refused(
    cycle: Cycle,
    step: ParallelStep | MapStep,
    resource: str,
    amount: float,
    left: float | None,
    whose: str,
) -> Failed:
    """The step's failure with ``BudgetExceeded``: its reservation can never fit."""
    cycle.checkpoint.fanout = None
    cycle.checkpoint.wait = None
    where = f"{left:g} left in the task's budget" if left is not None else (
        "more than the tenant's budget has left, its reservations returned")
    message = f"step {step.id!r} reserves {amount:g} {resource}: {where}"
    return Failed({"name": "BudgetExceeded", "message": message, "resource": resource,
                   "budget": whose})  # fmt: skip


def release(cycle: Cycle, fan: FanOut) -> None:
    """Return what the step reserved and did not spend; move its spend to the task's."""
    cp = cycle.checkpoint
    for resource, amount in (fan.reserved or {}).items():
        used = fan.spent.get(resource, 0.0)
        if resource in cp.budget:
            cp.budget[resource].reserved -= amount
            cp.budget[resource].spent += used
        unspent = amount - used
        if unspent:
            cycle.budget_delta[resource] = cycle.budget_delta.get(resource, 0.0) - unspent
        cycle.budget_released[resource] = cycle.budget_released.get(resource, 0.0) + amount
    fan.reserved = None
