"""A worker's firing pass: due schedule ticks start their tasks, in every worker at once.

No scheduler process: each worker runs :class:`TickFirer` beside its claim loop. Once a
second, or at the next tick if that comes sooner, it asks the store to fire the due ticks
of the schedules of its definitions (:meth:`Schedules.fire_due`); the store's compare-and-set
on each schedule's next tick lets one worker fire a tick and the others find it fired
(docs/schedules.md). A worker that crashes leaves its due ticks to the next pass of any
other. Database outages are the supervisor's to report: the pass just tries again later.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from toolkit.errors import ToolkitError
from toolkit.metrics import WorkerMetrics
from toolkit.runtime.statement_gate import StatementGate
from toolkit.store.schedules import Fired, Schedules

logger = logging.getLogger("toolkit.runtime.supervisor")

#: Seconds between two firing passes at most.
PASS_INTERVAL = 1.0


class TickFirer:
    """Fire the due ticks of the schedules of some definitions, until cancelled.

    Args:
        schedules: the store's schedules.
        definitions: the names of the definitions the worker runs.
        metrics: where ticks and their lag are counted.
        gate: the supervisor's statement gate (each pass runs through it).
    """

    def __init__(
        self,
        schedules: Schedules,
        definitions: Sequence[str],
        metrics: WorkerMetrics,
        gate: StatementGate,
    ) -> None:
        self._schedules = schedules
        self._gate = gate
        self._definitions = sorted(set(definitions))
        self._metrics = metrics

    async def run(self) -> None:
        """Pass after pass; never raises (a failed pass is tried again a second later)."""
        while True:
            wait = PASS_INTERVAL
            try:
                async with self._gate.statement():
                    due = await self._schedules.fire_due(self._definitions)
                    until = await self._schedules.seconds_to_next_tick(self._definitions)
                for fired in due:
                    self._count(fired)
                if until is not None:
                    wait = min(PASS_INTERVAL, max(until, 0.01))
            except ToolkitError as exc:
                logger.debug("firing pass failed: %s", exc, extra={"action": "fire_failed"})
            await anyio.sleep(wait)

    def _count(self, fired: Fired) -> None:
        ticks, plan = self._metrics.ticks, fired.plan
        ticks.labels(fired.schedule, "fired").inc(len(fired.task_ids))
        for outcome, n in (("skipped", plan.skipped), ("missed", plan.missed),
                           ("caught_up", plan.caught_up)):  # fmt: skip
            if n:
                ticks.labels(fired.schedule, outcome).inc(n)
        for lag in fired.lag[: len(fired.task_ids)]:
            self._metrics.tick_lag.labels(fired.schedule).observe(max(lag, 0.0))
        if fired.task_ids:
            logger.info(
                "schedule %s started %s", fired.schedule,
                ", ".join(f"task {i}" for i in fired.task_ids),
                extra={"action": "ticks_fired", "schedule": fired.schedule},
            )  # fmt: skip
