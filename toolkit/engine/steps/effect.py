"""``effect``: call an application handler, with evidence, retries and reconciliation.

The attempt itself is :func:`toolkit.engine.attempts.attempt`; this module says what its
outcome means for the step: go on with the result, try again later, wait for the callback or
the limit, fail for good, or fail closed until an operator reconciles it.
"""

from __future__ import annotations

from toolkit.definition import EffectStep
from toolkit.engine.attempts import Attempt, AttemptKind, attempt, lost_attempt, retry_delay
from toolkit.engine.limits import limit_wait
from toolkit.engine.protocol import (
    Advance,
    Failed,
    Reconcile,
    Retry,
    StepContext,
    StepKind,
    Transition,
    Wait,
)
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.store.writes import NEVER, Event
from toolkit.waits import CallbackWait


async def run(ctx: StepContext, step: EffectStep) -> Transition:
    """One attempt at the effect, and what it came to."""
    return outcome(ctx, step, await attempt(ctx, step))


def outcome(ctx: StepContext, step: EffectStep, done: Attempt) -> Transition:
    """What an attempt's outcome means for the step."""
    if done.kind is AttemptKind.COMPLETED:
        return Advance(done.result, step.next)
    if done.kind is AttemptKind.RECONCILE:
        return Reconcile(done.occurrence, done.error)
    if done.kind is AttemptKind.CALLBACK:
        assert step.callback is not None
        token = ctx.cycle.checkpoint.callbacks[done.occurrence].token
        wait = CallbackWait(done.occurrence, token)
        event = Event(EventKind.WAITING, {"step": step.id, "callback": True})
        timeout = step.callback.timeout
        if timeout is None:
            return Wait(WaitReason.CALLBACK, wait, event, run_at=NEVER)
        return Wait(WaitReason.CALLBACK, wait, event, delay_seconds=timeout)
    if done.kind is AttemptKind.DEFERRED:
        assert done.deferral is not None
        return limit_wait(ctx.cycle, step, done.occurrence, done.deferral)
    assert done.error is not None
    delay = retry_delay(step, done)
    if delay is None:
        ctx.frame.attempts.pop(done.occurrence, None)
        return Failed({**done.error, "attempts": done.attempt})
    return Retry(done.occurrence, done.attempt, done.error, delay)


def taken_over(ctx: StepContext, step: EffectStep) -> Transition | None:
    """A lease lapsed in the middle of the step: the attempt in flight is lost, and counts.

    Returns:
        The step's failure once lost attempts reach ``max_attempts``, else None.
    """
    error = lost_attempt(ctx.cycle, ctx.frame, step)
    return None if error is None else Failed(error)


KIND = StepKind(run, taken_over)
