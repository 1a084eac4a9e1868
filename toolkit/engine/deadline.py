"""The workflow deadline (``timeout`` of a definition, or of one submit).

Past it, what was in progress is abandoned as a cancellation abandons it: a wait ends, a
child is cancelled, a parallel or map step's reservation is released, an effect's recorded
intent stays in the evidence without an outcome. Then the task goes on at ``on_timeout``,
or fails with ``Timeout``.
"""

from __future__ import annotations

import functools

from toolkit.engine.cycle import Cycle
from toolkit.engine.failures import Error
from toolkit.engine.map_children import cancel_map_children
from toolkit.engine.reservations import release
from toolkit.errors import TaskTerminal
from toolkit.lifecycle import EventKind
from toolkit.store.writes import Event
from toolkit.waits import ChildWait


async def deadline_passed(cycle: Cycle) -> Error | None:
    """Abandon what is in progress; go to ``on_timeout``.

    Returns:
        None when the task goes on at ``on_timeout`` (the deadline is then cleared by the
        next write), else the ``Timeout`` error to fail the task with.
    """
    cp = cycle.checkpoint
    step = cp.cursor
    error: Error = {"name": "Timeout", "message": "the workflow deadline passed", "step": step}
    tasks = cycle.services.store.tasks
    if cp.fanout is not None:
        release(cycle, cp.fanout)
        cycle.end_branches(cp.fanout.occurrence)
        cp.fanout = None
        # children its waiting branches started are not waited for any more
        await cycle.retrying(
            functools.partial(tasks.cancel_descendants, [cycle.task.id], cycle.task.tenant)
        )
    if isinstance(cp.wait, ChildWait):
        try:
            await cycle.retrying(
                functools.partial(
                    tasks.cancel, cp.wait.child, "parent timed out", tenant=cycle.task.tenant
                )
            )
        except TaskTerminal:
            pass  # it ended meanwhile
    await cancel_map_children(cycle, "parent timed out")  # not waited for any more
    cp.wait = None
    cp.pending = None
    cp.callbacks.clear()
    cycle.events.append(Event(EventKind.DEADLINE_PASSED, {"step": step}))
    target = cycle.definition.on_timeout
    if target is None:
        return error
    if step is not None:
        cp.outputs[step] = {"error": error}
    cp.enter(target)
    cycle.clear_deadline = True
    return None
