"""A starting task subscribes to the events its waits match and its cancel_on names.

The match values of a ``wait: {event, match}`` read the task's input and context only, so
they are known before any step runs: the task's first cycle subscribes to every correlated
wait of its definition, and every matching event emitted since the task was submitted is
delivered to it then, kept until the wait takes it, like a signal sent early.
"""

from __future__ import annotations

import functools
from typing import Any

from toolkit.definition import Subscription
from toolkit.engine.cycle import Cycle


async def subscribe(cycle: Cycle) -> str | None:
    """Subscribe the cycle's task to its definition's correlated waits and ``cancel_on``.

    Idempotent: a first cycle that ends before its first write subscribes again next time.

    Returns:
        Why the task is to be cancelled now: an event its ``cancel_on`` matches was emitted
        since it was submitted (``"event 12 (order.cancelled)"``); else None.

    Raises:
        ExpressionError: a match value cannot be computed from the input.
        DatabaseUnavailable: the database stayed unreachable while the lease surely held.
    """
    found = cycle.definition.subscriptions()
    if not found:
        return None
    scope = cycle.scope()
    rendered: list[tuple[Subscription, Any]] = [
        (sub, {field: value.render(scope) for field, value in sub.match.items()})
        for sub in found
    ]
    events = cycle.services.store.events
    return await cycle.retrying(
        functools.partial(events.subscribe, cycle.task.id, cycle.task.tenant, rendered)
    )
