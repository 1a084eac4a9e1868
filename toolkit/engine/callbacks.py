"""Callbacks: an effect whose outcome is completed from outside (``callback:``).

The handler hands out a token; the step's outcome is what ``toolkit complete TOKEN`` says,
or ``Timeout`` once the callback's timeout passed without it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from toolkit.checkpoint import Frame
from toolkit.definition import EffectStep
from toolkit.engine.cycle import Cycle
from toolkit.engine.failures import Error
from toolkit.waits import CallbackWait


@dataclasses.dataclass(frozen=True)
class CallbackOutcome:
    """What the callback of a called attempt came to.

    ``completed`` (with ``result``), ``failed`` (with ``error``: a completion's error or
    ``Timeout``) or ``open`` (not yet).
    """

    kind: Literal["completed", "failed", "open"]
    attempt: int
    result: Any = None
    error: Error | None = None


async def callback_outcome(
    cycle: Cycle, frame: Frame, step: EffectStep, occurrence: str
) -> CallbackOutcome:
    """What the callback of ``occurrence``'s called attempt came to.

    A task (or a branch, ``frame``) resumed while it waits for a callback that has not come
    was resumed at the callback's timeout (a branch knows it from its timer: ``due``); a
    callback found expired timed out too: the token expires and the attempt fails with
    ``Timeout``.
    """
    cp = cycle.checkpoint
    callbacks = cycle.services.store.callbacks
    callback = cp.callbacks[occurrence]
    tenant = cycle.task.tenant
    record = await cycle.retrying(functools.partial(callbacks.get, callback.token, tenant=tenant))
    if record is not None and record.state == "completed":
        cp.callbacks.pop(occurrence)
        frame.wait = None
        if record.error is not None:
            error = {"name": str(record.error.get("name", "CallbackFailed")),
                     "message": str(record.error.get("message", ""))}  # fmt: skip
            return CallbackOutcome("failed", callback.attempt, error=error)
        return CallbackOutcome("completed", callback.attempt, result=record.result)
    wait = frame.wait
    assert step.callback is not None
    # ``due``: claimed once the wait's run_at passed, a deadline only when it has a timeout
    timed_out = (
        isinstance(wait, CallbackWait) and wait.callback == callback.token and frame.due
        and step.callback.timeout is not None
    )  # fmt: skip
    if timed_out or record is None or record.state == "expired":
        await cycle.retrying(functools.partial(callbacks.expire, callback.token, tenant=tenant))
        cp.callbacks.pop(occurrence)
        frame.wait = None
        return CallbackOutcome("failed", callback.attempt, error=timeout_error(step))
    return CallbackOutcome("open", callback.attempt)


def timeout_error(step: EffectStep) -> Error:
    """The error of a callback that was not completed within its timeout."""
    assert step.callback is not None
    timeout = step.callback.timeout
    within = f" within {timeout:g} s" if timeout is not None else ""
    return {
        "name": "Timeout",
        "message": f"no completion of the callback of step {step.id!r}{within}",
    }
