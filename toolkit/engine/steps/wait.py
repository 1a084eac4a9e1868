"""``wait``: durable timers, signals, and the first of several (``any``).

A wait is stored in the checkpoint and its end is the task's ``run_at`` (database time): a
claim of a waiting task with no signal stored is the wait's deadline passing.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

from toolkit.definition import WaitStep
from toolkit.engine.protocol import Advance, Failed, StepContext, StepKind, Transition, Wait
from toolkit.errors import ExpressionError
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.store.writes import NEVER, Event
from toolkit.waits import AnyWait, SignalWait, TimerWait


async def run(ctx: StepContext, step: WaitStep) -> Transition:
    """Go on once the timer passed or the signal is there, else wait for it.

    Raises:
        ExpressionError: ``until`` is not an ISO-8601 timestamp with a UTC offset.
    """
    if step.any:
        return await _first_of(ctx, step)
    frame = ctx.frame
    occurrence = frame.occurrence(step.id)
    # A task is claimed again once its wait's deadline passed (or what it waits for came);
    # a branch read back waiting knows from its row whether its timer passed (``due``).
    resumed = frame.wait is not None and frame.wait.occurrence == occurrence
    passed = resumed and frame.due
    awaited = step.awaited  # a signal's name, or an event's (delivered as a signal)
    if awaited is not None:
        found = await take_signal(ctx, [awaited], occurrence)
        if found is not None:
            frame.wait = None
            return Advance(found[1], step.next)
        what = f"event {step.event!r}" if step.event is not None else f"signal {awaited!r}"
        if passed and step.timeout is not None:  # nothing stored: the deadline passed
            frame.wait = None
            message = f"no {what} within {step.timeout:g} s"
            return Failed({"name": "Timeout", "message": message})
        detail = {"event": step.event} if step.event is not None else {"signal": awaited}
        event = Event(EventKind.WAITING, {"step": step.id, **detail})
        wait = SignalWait(occurrence, awaited)
        if step.timeout is None:
            return Wait(WaitReason.SIGNAL, wait, event, run_at=NEVER)
        return Wait(WaitReason.SIGNAL, wait, event, delay_seconds=step.timeout)
    if passed:  # a timer wait is only resumed once its run_at has passed
        frame.wait = None
        return Advance(None, step.next)
    if frame.wait is not None and resumed:  # a branch woken for nothing: it waits on
        event = Event(EventKind.WAITING, {"step": step.id, "timer": True})
        return Wait(WaitReason.TIMER, frame.wait, event, run_at=NEVER)
    event = Event(EventKind.WAITING, {"step": step.id, "timer": True})
    if step.until is not None:
        until = timestamp(step.until.render(ctx.scope), step.id)
        return Wait(WaitReason.TIMER, TimerWait(occurrence), event, run_at=until)
    return Wait(WaitReason.TIMER, TimerWait(occurrence), event, delay_seconds=step.duration)


async def _first_of(ctx: StepContext, step: WaitStep) -> Transition:
    """``wait: {any: [...]}``: the first of several signals, events and timers decides.

    Only the winning signal (or event) is consumed. The timers' deadline is fixed when the
    wait starts (database time) and kept in the checkpoint; a claim without a signal stored
    is that deadline passing.
    """
    cycle = ctx.cycle
    frame = ctx.frame
    occurrence = frame.occurrence(step.id)
    resumed = frame.wait is not None and frame.wait.occurrence == occurrence
    names = [event.awaited for event in step.any if event.awaited is not None]
    found = await take_signal(ctx, names, occurrence) if names else None
    if found is not None:
        name, payload = found
        came = next(event for event in step.any if event.awaited == name)
        frame.wait = None
        return Advance({"event": came.event or name, "payload": payload}, came.next)
    timers = [event for event in step.any if event.awaited is None]
    if resumed and frame.due and timers:
        wait = frame.wait
        index = wait.timer if isinstance(wait, AnyWait) and wait.timer else 0
        frame.wait = None
        return Advance({"event": "timer"}, timers[index].next)
    run_at = NEVER
    earliest = None
    if timers:  # each timer as a moment in database time; the earliest is the deadline
        now = await cycle.retrying(cycle.services.store.leases.database_now)
        moments = [
            datetime.datetime.fromisoformat(timestamp(event.until.render(ctx.scope), step.id))
            if event.until is not None
            else now + datetime.timedelta(seconds=event.duration or 0)
            for event in timers
        ]
        earliest = min(range(len(timers)), key=moments.__getitem__)
        run_at = moments[earliest].isoformat()
    until = None if run_at == NEVER else run_at
    reason = WaitReason.SIGNAL if names else WaitReason.TIMER
    event = Event(
        EventKind.WAITING, {"step": step.id, "signals": names, "until": until, "reason": reason}
    )
    return Wait(reason, AnyWait(occurrence, tuple(names), earliest), event, run_at=run_at)


async def take_signal(
    ctx: StepContext, names: list[str], occurrence: str
) -> tuple[str, Any] | None:
    """Take the oldest stored signal of ``names`` for ``occurrence``: ``(name, payload)``.

    In a branch, a signal addressed to the branch counts as well as one to the whole task.
    Only the signal taken is consumed, by the cycle's next fenced write.
    """
    cycle = ctx.cycle
    leases = cycle.services.store.leases
    async with cycle.signal_lock:  # two branches never take the same signal
        taken = list(cycle.signals_taken)
        found = await cycle.retrying(
            functools.partial(
                leases.next_signal,
                cycle.task.id,
                names,
                taken,
                ctx.address,
                tenant=cycle.task.tenant,
            )
        )
        if found is None:
            return None
        signal_id, name, payload = found
        cycle.signals_taken.append(signal_id)
    cycle.signals.append((signal_id, occurrence))
    return name, payload


def timestamp(value: Any, step: str) -> str:
    """Check that ``value`` is an ISO-8601 timestamp with a UTC offset; return it.

    Raises:
        ExpressionError: it is not.
    """
    try:
        parsed = datetime.datetime.fromisoformat(str(value))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ExpressionError(
            f"step {step!r}: wait until {value!r} is not an ISO-8601 timestamp with a UTC offset",
            step=step,
        )
    return parsed.isoformat()


KIND = StepKind(run)
