"""The end of a distributed map's children when their map ends otherwise than by counting.

A distributed map's children are tasks of their own: when the map's task is cancelled, runs
past its deadline, or its step fails while listing (docs/composition.md#distributed-map),
the children it started are not waited for any more and must not run on. This cancels them
(and their own children), fenced by the task's lease.
"""

from __future__ import annotations

import functools

from toolkit.engine.cycle import Cycle
from toolkit.waits import MapItemsWait


async def cancel_map_children(
    cycle: Cycle, reason: str, occurrence: str | None = None
) -> list[int]:
    """Cancel the live children of a distributed map of the task.

    Args:
        cycle: the cycle of the map's task.
        reason: the children's cancel reason.
        occurrence: the map step's occurrence; None: the one the checkpoint's ``wait`` is
            at, if it is at one.

    Returns:
        The ids of the children cancelled or asked to stop (none when the task is not at a
        distributed map).

    Raises:
        LeaseLost: the task's lease is gone; nothing was cancelled.
    """
    if occurrence is None:
        wait = cycle.checkpoint.wait
        if not isinstance(wait, MapItemsWait):
            return []
        occurrence = wait.occurrence
    store = cycle.services.store
    ids = await cycle.retrying(
        functools.partial(store.map_items.cancel_live, cycle.fence, occurrence, reason)
    )
    if ids:
        cancel = store.tasks.cancel_descendants  # its children have its tenant
        await cycle.retrying(functools.partial(cancel, ids, cycle.task.tenant))
    return ids
