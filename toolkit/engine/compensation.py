"""Compensation (sagas): a failing task undoes its completed effects, newest first.

Each compensation is an effect with its own evidence and idempotency key
(``compensate/<occurrence>/<step>#1``); each one's end is committed before the next starts,
so a crash resumes the compensation in progress and never repeats a finished one. A
compensation that fails for good is recorded and the others still run (DESIGN §2).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from toolkit.checkpoint import BranchFrame
from toolkit.definition import EffectStep, RetryPolicy
from toolkit.definition.expressions import compile_template
from toolkit.engine.attempts import AttemptKind, attempt, lost_attempt, retry_delay
from toolkit.engine.cycle import Cycle, CycleOutcome
from toolkit.engine.limits import limit_wait
from toolkit.engine.protocol import Kinds, Reconcile, Retry, Spend, StepContext, Transition
from toolkit.lifecycle import EventKind, TaskState
from toolkit.store.writes import Event

#: The arguments of a step built by the engine (a compensation's are passed as they are).
_NO_ARGS = compile_template(None)

Apply = Callable[[EffectStep, Transition], Awaitable[CycleOutcome | None]]


async def compensate(cycle: Cycle, kinds: Kinds, apply: Apply) -> CycleOutcome:
    """Run the compensations of the completed effects, newest first, then end failed.

    Args:
        cycle: the cycle of a task whose ``compensating`` is set.
        kinds: the step kinds (for the compensations' step context).
        apply: the task level's application of a transition: a compensation that waits for
            reconciliation or a limit, or is tried again later, ends the cycle through it.

    Returns:
        ``FAILED`` once every compensation ran; else how the cycle ended meanwhile.
    """
    cp = cycle.checkpoint
    state = cp.compensating
    assert state is not None
    if cp.pending is not None and cp.pending.startswith("compensate/"):
        cp.pending = None  # the compensation's frame keeps its own pending occurrence
    first = True
    while cp.compensable:
        entry = cp.compensable[-1]
        prefix = f"compensate/{entry.occurrence}/"
        if state.frame is None or state.frame.prefix != prefix:
            state.frame = BranchFrame.start(entry.step, prefix)
        frame = state.frame
        step = EffectStep(
            id=entry.step, handler=entry.handler, idempotent=entry.idempotent, args=_NO_ARGS,
            retry=RetryPolicy(), timeout=None, next=None,
        )  # fmt: skip
        if first and cycle.task.recovered:
            lost_attempt(cycle, frame, step)
        first = False
        ctx = StepContext(cycle, frame, cycle.scope(), Spend(dict, cycle.charge), kinds)
        done = await attempt(ctx, step, entry.args)
        if done.kind is AttemptKind.RECONCILE:
            return await _ends(apply, step, Reconcile(done.occurrence, done.error))
        if done.kind is AttemptKind.DEFERRED:
            assert done.deferral is not None
            return await _ends(apply, step, limit_wait(cycle, step, done.occurrence,
                                                       done.deferral))  # fmt: skip
        if done.kind is AttemptKind.FAILED:
            delay = retry_delay(step, done)
            if delay is not None:
                retry = Retry(done.occurrence, done.attempt, done.error, delay)
                return await _ends(apply, step, retry)
        outcome: dict[str, Any] = {"step": entry.step, "occurrence": entry.occurrence,
                                   "handler": entry.handler, "outcome": done.kind}  # fmt: skip
        if done.kind is AttemptKind.COMPLETED:
            outcome["result"] = done.result
        else:
            outcome["error"] = done.error
        state.outcomes.append(outcome)
        cp.compensable.pop()
        state.frame = None
        cycle.events.append(Event(EventKind.COMPENSATED, outcome))
        await cycle.commit()
    ok = all(item["outcome"] == "completed" for item in state.outcomes)
    error = {**state.error, "compensation": "completed" if ok else "failed"}
    outcomes = state.outcomes
    cp.compensating = None
    cp.cursor = None
    cycle.events.append(Event(EventKind.FAILED, {"error": error}))
    await cycle.commit(
        state=TaskState.FAILED, error=error, result={"compensations": outcomes}
    )
    return CycleOutcome.FAILED


async def _ends(apply: Apply, step: EffectStep, transition: Transition) -> CycleOutcome:
    outcome = await apply(step, transition)
    assert outcome is not None, "a wait, reconciliation or retry ends the cycle"
    return outcome
