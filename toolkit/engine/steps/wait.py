"""``wait``: durable timers, signals, and the first of several (``any``).

A wait is stored in the checkpoint and its end is the task's ``run_at`` (database time): a
claim of a waiting task with no signal stored is the wait's deadline passing.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

from toolkit.checkpoint import AnyWait, SignalWait, TimerWait
from toolkit.definition import WaitStep
from toolkit.engine.cycle import Cycle
from toolkit.engine.protocol import Advance, Failed, StepContext, StepKind, Transition, Wait
from toolkit.errors import ExpressionError
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.store.writes import NEVER, Event


async def run(ctx: StepContext, step: WaitStep) -> Transition:
    """Go on once the timer passed or the signal is there, else wait for it.

    Raises:
        ExpressionError: ``until`` is not an ISO-8601 timestamp with a UTC offset.
    """
    if step.any:
        return await _first_of(ctx, step)
    cycle = ctx.cycle
    cp = cycle.checkpoint
    occurrence = ctx.frame.occurrence(step.id)
    resumed = cp.wait is not None and cp.wait.occurrence == occurrence
    if step.signal is not None:
        found = await take_signal(cycle, [step.signal], occurrence)
        if found is not None:
            cp.wait = None
            return Advance(found[1], step.next)
        if resumed:  # claimed with no signal stored: the wait's deadline passed
            cp.wait = None
            message = f"no signal {step.signal!r} within {step.timeout:g} s"
            return Failed({"name": "Timeout", "message": message})
        event = Event(EventKind.WAITING, {"step": step.id, "signal": step.signal})
        wait = SignalWait(occurrence, step.signal)
        if step.timeout is None:
            return Wait(WaitReason.SIGNAL, wait, event, run_at=NEVER)
        return Wait(WaitReason.SIGNAL, wait, event, delay_seconds=step.timeout)
    if resumed:  # a timer wait is only claimed again once its run_at has passed
        cp.wait = None
        return Advance(None, step.next)
    event = Event(EventKind.WAITING, {"step": step.id, "timer": True})
    if step.until is not None:
        until = timestamp(step.until.render(ctx.scope), step.id)
        return Wait(WaitReason.TIMER, TimerWait(occurrence), event, run_at=until)
    return Wait(WaitReason.TIMER, TimerWait(occurrence), event, delay_seconds=step.duration)


async def _first_of(ctx: StepContext, step: WaitStep) -> Transition:
    """``wait: {any: [...]}``: the first of several signals and timers decides where to go.

    Only the winning signal is consumed. The timers' deadline is fixed when the wait starts
    (database time) and kept in the checkpoint; a claim without a signal stored is that
    deadline passing.
    """
    cycle = ctx.cycle
    cp = cycle.checkpoint
    occurrence = ctx.frame.occurrence(step.id)
    resumed = cp.wait is not None and cp.wait.occurrence == occurrence
    names = [event.signal for event in step.any if event.signal is not None]
    found = await take_signal(cycle, names, occurrence) if names else None
    if found is not None:
        name, payload = found
        target = next(event.next for event in step.any if event.signal == name)
        cp.wait = None
        return Advance({"event": name, "payload": payload}, target)
    timers = [event for event in step.any if event.signal is None]
    if resumed and timers:
        index = cp.wait.timer if isinstance(cp.wait, AnyWait) and cp.wait.timer else 0
        cp.wait = None
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
    cycle: Cycle, names: list[str], occurrence: str
) -> tuple[str, Any] | None:
    """Take the oldest stored signal of ``names`` for ``occurrence``: ``(name, payload)``.

    Only the signal taken is consumed, by the cycle's next fenced write.
    """
    taken = [signal_id for signal_id, _ in cycle.signals]
    found = await cycle.retrying(
        functools.partial(cycle.services.store.leases.next_signal, cycle.task.id, names, taken)
    )
    if found is None:
        return None
    signal_id, name, payload = found
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
