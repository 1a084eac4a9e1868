"""One attempt at an effect: the one place that decides what an attempt came to.

An attempt records its intent first when the effect is not idempotent (DESIGN §2,
"Effect"), takes the step's downstream limits, calls the handler with the occurrence's
idempotency key, and appends the evidence of what happened. The effect step, a compensation
and an effect inside a branch all attempt through :func:`attempt`; what the outcome means
for the graph is theirs to say.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import time
from typing import Any, TypeVar

import anyio

from toolkit import faults, tracing
from toolkit.application import EffectContext, Handler, SpendMeter
from toolkit.checkpoint import CallbackState, Compensable, Frame
from toolkit.definition import EffectStep
from toolkit.engine.callbacks import callback_outcome
from toolkit.engine.cycle import Cycle, WorkerStopping
from toolkit.engine.failures import NEVER_RETRIED, Error, error_data
from toolkit.engine.limits import take_limits
from toolkit.engine.protocol import StepContext
from toolkit.engine.threads import in_thread
from toolkit.errors import DatabaseUnavailable, ResultNotJson, ResultTooLarge
from toolkit.lifecycle import EventKind
from toolkit.store.callbacks import new_token
from toolkit.store.limits import LimitDeferral
from toolkit.store.writes import Event, EvidenceRecord

#: The worker's log of its tasks: the interpreter's logger, so that every per-task record of
#: the engine comes from one name (docs/operations.md#logs).
logger = logging.getLogger("toolkit.engine.interpreter")


class AttemptKind(enum.StrEnum):
    """What an attempt came to."""

    #: the handler returned (``result``), or the operator recorded that it did.
    COMPLETED = "completed"
    #: it failed (``error``); ``final``: no retry may follow, whatever the policy.
    FAILED = "failed"
    #: its outcome is unknown and the effect not idempotent: fail closed (``error``: why,
    #: when a timeout made it unknown).
    RECONCILE = "reconcile"
    #: the handler returned and the step's callback has not been completed yet.
    CALLBACK = "callback"
    #: a downstream limit was full: nothing was called (``deferral`` says until when).
    DEFERRED = "deferred"


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What one attempt at an effect occurrence came to (see :class:`AttemptKind`)."""

    kind: AttemptKind
    occurrence: str
    attempt: int = 0
    result: Any = None
    error: Error | None = None
    final: bool = False
    deferral: LimitDeferral | None = None


T = TypeVar("T")


class TimedOut(Exception):
    """The step's timeout passed before the handler returned."""


async def _stop_before_intent(cycle: Cycle) -> None:
    """The worker stops: start no call whose cut-off would need reconciliation.

    Such a call would be cut off at the end of the grace (docs/operations.md, "Graceful
    shutdown"). The task is released at this step (`WorkerStopping`). A branch waits
    instead, so that its siblings' calls may still end within the grace; the cycle is then
    cancelled and releases the task as usual.

    Raises:
        WorkerStopping: not within branches.
    """
    if not cycle.fanning_out:
        raise WorkerStopping
    await anyio.sleep_forever()


async def attempt(ctx: StepContext, step: EffectStep, args: Any = None) -> Attempt:
    """One attempt at an effect in ``ctx.frame`` (the task's graph or a branch's).

    Records the intent (not idempotent), calls the handler, appends the evidence with what
    the call spent, and charges the spend (``ctx.spend``): limited by resource as read at
    each report, less what other calls of the cycle have in flight. An intent found without
    outcome is applied from the operator's resolution, or reported ``reconcile``. For a step
    with ``callback``, the handler's return is followed by the callback's completion (kind
    ``callback`` while it has not come). ``args``, when given, are used as they are instead
    of rendering the step's (a compensation's, rendered when its step completed).
    """
    cycle, frame, scope = ctx.cycle, ctx.frame, ctx.scope
    cp = cycle.checkpoint
    task = cycle.task
    services = cycle.services
    occurrence = frame.occurrence(step.id)
    key = f"{task.id}:{occurrence}"
    callback = cp.callbacks.get(occurrence) if step.callback is not None else None
    if callback is not None and callback.called:
        return await _after_callback(ctx, step, occurrence)
    if frame.pending == occurrence:
        resolution = cp.resolution
        if resolution is None or resolution.occurrence != occurrence:
            # Intent recorded, outcome unknown, not idempotent: fail closed (DESIGN §2).
            return Attempt(AttemptKind.RECONCILE, occurrence)
        cp.resolution = None
        frame.pending = None
        if resolution.outcome == "completed":
            frame.attempts.pop(occurrence, None)
            compensable(cycle, step, occurrence, scope, resolution.result)
            return Attempt(AttemptKind.COMPLETED, occurrence, result=resolution.result)
        if resolution.outcome == "failed":
            tried = frame.attempts.get(occurrence, 1)
            return Attempt(AttemptKind.FAILED, occurrence, tried, error=resolution.error)
        # "retry": call again below, with a new intent record and the same key.
    if not step.idempotent and cycle.control.stopping:
        await _stop_before_intent(cycle)  # before any limit's slot is taken
    handler = services.app.handler(step.handler)
    limits = services.app.step_limits(step)
    if limits:  # downstream limits: taken before the intent, released with the evidence
        deferral = await take_limits(cycle, frame, step, occurrence, limits)
        if deferral is not None:
            return Attempt(AttemptKind.DEFERRED, occurrence, deferral=deferral)
        cycle.prompt_write = True  # the slots taken are released with this call's outcome
    number = frame.attempts.get(occurrence, 0) + 1
    span = tracing.current()  # the step's span: this attempt is its work
    span.set("step.attempt", number)
    span.set("effect.handler", step.handler)
    span.set("effect.idempotent", step.idempotent)
    if args is None:
        context = {**scope["context"], "attempt": number}
        args = step.args.render({**scope, "context": context})
    meter = SpendMeter(ctx.spend.limits, cycle.spend_ledger)
    tags: dict[str, str] = {}  # ctx.tag of this call: written with its outcome

    def record(kind: Any, result: Any = None, error: Any = None) -> EvidenceRecord:
        spend = dict(meter.spent) or None
        if kind != "started":
            meter.settle(ctx.spend.charge)
            cycle.set_tags(tags)
        return EvidenceRecord(
            occurrence=occurrence, step=step.id, handler=step.handler,
            idempotent=step.idempotent, idempotency_key=key, record=kind, attempt=number,
            result=result, error=error, spend=None if kind == "started" else spend,
            limited=bool(limits),
        )  # fmt: skip

    if faults.ARMED:
        faults.fault_point("before_intent", step.id)
    if not step.idempotent:
        # The intent carries the attempt; a takeover finds it pending and reconciles.
        frame.attempts[occurrence] = number
        cycle.evidence.append(record("started"))
        frame.pending = occurrence
    token = None
    if step.callback is not None:  # registered before the call: an early completion is kept
        token = new_token()
        cp.callbacks[occurrence] = CallbackState(token, number)
        frame.attempts[occurrence] = number
        if cycle.dirty:
            await cycle.commit()
        await cycle.retrying(
            functools.partial(services.store.callbacks.create, cycle.fence, occurrence, number,
                              token)
        )  # fmt: skip
    if cycle.dirty and not (step.idempotent and cycle.may_defer_write()):
        await cycle.commit()
    # An idempotent attempt is not written before the call: a takeover counts it as lost.
    # (Nor during it: a sibling branch's write stores the attempts without it.)
    frame.attempts[occurrence] = number
    if step.idempotent:
        frame.in_flight = (occurrence, number)
    if faults.ARMED:
        faults.fault_point("after_intent", step.id)

    effect = EffectContext(
        task_id=task.id,
        tenant=task.tenant,
        workflow=(cycle.definition.name, cycle.definition.version),
        step=step.id,
        occurrence=occurrence,
        attempt=number,
        fencing_token=task.token,
        idempotency_key=key,
        _connection=services.store.db.connection,
        _stop=cycle.control.new_call(),
        _spend=meter,
        callback_token=token,
        task_tags=dict(cycle.tags_now),
        _tags_set=tags,
        _publish=functools.partial(services.store.streams.publish, cycle.fence, occurrence),
        _progress=functools.partial(services.store.streams.progress, task.id),
        _loop=cycle.loop_token,
    )
    started = time.monotonic()
    outcome = "error"
    try:
        result = await call(cycle, handler, step, effect, args)
        outcome = "completed"
    except (ResultNotJson, ResultTooLarge) as exc:
        # The call happened; its result cannot be recorded. Not an attempt to repeat: the
        # step fails for good (its catch applies).
        error = error_data(exc)
        _log_failed(cycle, step, occurrence, number, error)
        frame.pending = None
        cp.callbacks.pop(occurrence, None)
        cycle.evidence.append(record("failed", error=error))
        return Attempt(AttemptKind.FAILED, occurrence, number, error=error, final=True)
    except TimedOut:
        error = {"name": "Timeout", "message": f"step {step.id!r} ran past {step.timeout:g} s"}
        _log_failed(cycle, step, occurrence, number, error)
        if not step.idempotent:
            # The call may or may not have had its effect: uncertain, so reconcile.
            meter.settle()
            return Attempt(AttemptKind.RECONCILE, occurrence, number, error=error)
        cp.callbacks.pop(occurrence, None)
        cycle.evidence.append(record("failed", error=error))
        return Attempt(AttemptKind.FAILED, occurrence, number, error=error)
    except Exception as exc:  # a handler's error is data: it goes to the retry policy
        error = error_data(exc)
        # The stored error is its name and message; the log has where it was raised.
        _log_failed(cycle, step, occurrence, number, error, exc)
        frame.pending = None
        cp.callbacks.pop(occurrence, None)
        cycle.evidence.append(record("failed", error=error))
        final = error["name"] in NEVER_RETRIED
        return Attempt(AttemptKind.FAILED, occurrence, number, error=error, final=final)
    except BaseException:  # cancelled: no evidence, so its spend is not charged
        meter.settle()
        raise
    finally:
        frame.in_flight = None
        metrics = services.metrics
        if metrics is not None:
            metrics.child(metrics.step_duration, cycle.definition.name, step.id, outcome).observe(
                time.monotonic() - started
            )
    if faults.ARMED:
        faults.fault_point("after_call", step.id)
    frame.pending = None
    if token is not None:
        # The handler handed the token out; the step's outcome is the completion's.
        cp.callbacks[occurrence].called = True
        cycle.evidence.append(
            record("completed", result={"callback": token, "handler": result})
        )
        return await _after_callback(ctx, step, occurrence)
    frame.attempts.pop(occurrence, None)
    cycle.evidence.append(record("completed", result=result))
    compensable(cycle, step, occurrence, scope, result)
    return Attempt(AttemptKind.COMPLETED, occurrence, number, result=result)


def _log_failed(
    cycle: Cycle,
    step: EffectStep,
    occurrence: str,
    number: int,
    error: Error,
    raised: BaseException | None = None,
) -> None:
    """Log a failed attempt at WARNING, with the traceback of what the handler ``raised``.

    A handler that failed because the database is unreachable logs at INFO, without a
    traceback: the outage itself is the supervisor's one warning (docs/operations.md#logs).
    """
    task = cycle.task
    outage = isinstance(raised, DatabaseUnavailable)
    logger.log(
        logging.INFO if outage else logging.WARNING,
        "task %s: step %r, attempt %s: handler %r failed: %s: %s",
        task.id, step.id, number, step.handler, error["name"], error["message"],
        exc_info=None if outage else raised,
        extra={
            "action": "effect_failed", "task_id": task.id, "step": step.id,
            "occurrence": occurrence, "attempt": number, "handler": step.handler,
            "error": error["name"],
        },
    )  # fmt: skip


async def _after_callback(ctx: StepContext, step: EffectStep, occurrence: str) -> Attempt:
    """What the callback of a called attempt came to, as an attempt."""
    outcome = await callback_outcome(ctx.cycle, ctx.frame, step, occurrence)
    if outcome.kind == "completed":
        ctx.frame.attempts.pop(occurrence, None)
        compensable(ctx.cycle, step, occurrence, ctx.scope, outcome.result)
        return Attempt(AttemptKind.COMPLETED, occurrence, outcome.attempt, result=outcome.result)
    if outcome.kind == "failed":
        return Attempt(AttemptKind.FAILED, occurrence, outcome.attempt, error=outcome.error)
    return Attempt(AttemptKind.CALLBACK, occurrence, outcome.attempt)


def compensable(
    cycle: Cycle, step: EffectStep, occurrence: str, scope: dict[str, Any], result: Any
) -> None:
    """Remember how to undo a completed effect, with its arguments rendered now."""
    if step.compensate is None:
        return
    steps = {**scope["steps"], step.id: result}
    cycle.checkpoint.compensable.append(
        Compensable(
            step=step.id,
            occurrence=occurrence,
            handler=step.compensate.handler,
            idempotent=step.compensate.idempotent,
            args=step.compensate.args.render({**scope, "steps": steps}),
        )
    )


async def call(
    cycle: Cycle, handler: Handler, step: EffectStep, ctx: EffectContext, args: Any
) -> Any:
    """Call the handler within the step's timeout; check that its result can be stored.

    Raises:
        TimedOut: the step's timeout passed first (the call is told to stop).
        ResultNotJson, ResultTooLarge: the result cannot be stored.
    """
    if step.timeout is None:  # the common case: no cancel scope of its own (hot path)
        result = await _invoke(handler, ctx, args)
    else:
        # Given up past the timeout and a grace, should it ignore its cancellation (see
        # CycleControl.calls): the supervisor then stops renewing the lease.
        calls = cycle.control.calls
        give_up = anyio.current_time() + step.timeout + cycle.control.call_grace
        calls[id(ctx)] = (give_up, step.id)
        try:
            with anyio.move_on_after(step.timeout) as scope:
                result = await _invoke(handler, ctx, args)
        finally:
            calls.pop(id(ctx), None)
        if scope.cancelled_caught:
            ctx._stop.set()
            raise TimedOut
    cycle.check_result(result, step.id, f"handler {step.handler!r}")
    return result


async def _invoke(handler: Handler, ctx: EffectContext, args: Any) -> Any:
    """Call a handler: async ones on the loop, sync ones in a daemon thread (``threads``)."""
    if handler.is_async:
        return await handler.call(ctx, args)
    return await in_thread(functools.partial(handler.call, ctx, args))


def retry_delay(step: EffectStep, done: Attempt) -> float | None:
    """Seconds before the next attempt after a failed one, or None: the step fails for good."""
    assert done.error is not None
    name = done.error["name"]
    policy = step.retry_policy(name)
    if done.final or policy is None or name in NEVER_RETRIED:
        return None
    if not policy.unlimited and done.attempt >= policy.max_attempts:
        return None
    return policy.delay(done.attempt)


def lost_attempt(cycle: Cycle, frame: Frame, step: EffectStep) -> Error | None:
    """Count the attempt a takeover found lost at ``step`` of ``frame``.

    Returns:
        The error failing the step once the lost attempts reach ``max_attempts``, else None.
        Nothing is counted when the intent is recorded: reconciliation decides then.
    """
    occurrence = frame.occurrence(step.id)
    if frame.pending == occurrence:
        return None
    frame.attempts[occurrence] = frame.attempts.get(occurrence, 0) + 1
    cycle.events.append(Event(EventKind.ATTEMPT_LOST, {"step": step.id, "occurrence": occurrence}))
    if frame.attempts[occurrence] < step.retry.max_attempts:
        return None
    frame.attempts.pop(occurrence)
    lost = step.retry.max_attempts
    message = f"step {step.id!r}: {lost} attempts were lost to crashes or expired leases"
    return {"name": "AttemptsExhausted", "message": message, "attempts": lost}
