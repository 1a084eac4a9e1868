"""Downstream limits of an effect (docs/limits.md): taken before its intent and its call.

A full limit defers the attempt: nothing is called, and the step waits (reason ``limit``)
until a slot or a token is expected; a released slot wakes the first waiting task.
"""

from __future__ import annotations

import datetime
import functools

from toolkit.checkpoint import Frame
from toolkit.definition import EffectStep
from toolkit.engine.cycle import Cycle
from toolkit.engine.protocol import Wait
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.store.limits import LimitDeferral
from toolkit.store.writes import Event
from toolkit.waits import LimitWait


async def take_limits(
    cycle: Cycle, frame: Frame, step: EffectStep, occurrence: str, names: tuple[str, ...]
) -> LimitDeferral | None:
    """Take the step's downstream limits before its intent and call.

    Evidence not yet written (a finished step's) is committed first: it releases that step's
    slots, which this task would otherwise count against itself.

    Returns:
        None once every limit is taken; else the deferral (nothing was taken).
    """
    cp = cycle.checkpoint
    wait = cp.wait if frame is cp and isinstance(cp.wait, LimitWait) else None
    if wait is not None and wait.occurrence != occurrence:
        wait = None
    if cycle.dirty:
        await cycle.commit()
    limits = cycle.services.store.limits
    taken = await cycle.retrying(
        functools.partial(
            limits.acquire, cycle.fence, occurrence, names, wait.deferrals if wait else 0
        )
    )
    metrics = cycle.services.metrics
    if isinstance(taken, LimitDeferral):
        if metrics is not None:
            metrics.child(metrics.limit_deferrals, cycle.definition.name, taken.name).inc()
        return taken
    if wait is not None:
        cp.wait = None
        if metrics is not None and wait.since:
            waited = (taken.now - datetime.datetime.fromisoformat(wait.since)).total_seconds()
            child = metrics.child(metrics.limit_wait, cycle.definition.name, wait.limit)
            child.observe(max(waited, 0.0))
    return None


def limit_wait(cycle: Cycle, step: EffectStep, occurrence: str, deferral: LimitDeferral) -> Wait:
    """The wait of an attempt a full limit deferred, until a slot or token is expected.

    It keeps the limit, its scope, the deferrals in a row and the first deferral's time
    (database time, for the wait metric). A branch, which cannot wait without its task's
    lease, looks again after ``delay_seconds`` instead.
    """
    previous = cycle.checkpoint.wait
    if not isinstance(previous, LimitWait) or previous.occurrence != occurrence:
        previous = None
    until = deferral.until.isoformat()
    wait = LimitWait(
        occurrence=occurrence,
        limit=deferral.name,
        scope=deferral.scope,
        deferrals=(previous.deferrals if previous else 0) + 1,
        since=(previous.since if previous else None) or deferral.now.isoformat(),
    )
    event = Event(
        EventKind.LIMIT_DEFERRED,
        {"step": step.id, "limit": deferral.name, "reason": deferral.reason, "until": until},
    )
    return Wait(
        WaitReason.LIMIT, wait, event, run_at=until, delay_seconds=deferral.delay_seconds
    )
