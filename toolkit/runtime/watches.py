"""The watches a supervisor runs beside its claim loop.

Event-loop lag; definitions no worker can run (DESIGN §5) and tasks held back by flow
control (docs/flow-control.md), as gauges of the whole fleet.
"""

from __future__ import annotations

import anyio

from toolkit.errors import ToolkitError
from toolkit.metrics import WorkerMetrics
from toolkit.runtime.report import SupervisorReport
from toolkit.runtime.statement_gate import StatementGate
from toolkit.store import Store

#: Seconds between two event-loop lag checks.
LAG_INTERVAL = 0.1
#: Seconds between two refreshes of the fleet gauges (definitions unavailable, tasks held).
FLEET_REFRESH = 15.0


async def watch_loop_lag(report: SupervisorReport, metrics: WorkerMetrics) -> None:
    """Measure how late the event loop wakes a sleeper (a stall), until cancelled."""
    while True:
        before = anyio.current_time()
        await anyio.sleep(LAG_INTERVAL)
        lag = max(anyio.current_time() - before - LAG_INTERVAL, 0.0)
        report.max_loop_lag = max(report.max_loop_lag, lag)
        metrics.loop_lag.observe(lag)


async def watch_fleet(store: Store, metrics: WorkerMetrics, gate: StatementGate) -> None:
    """Refresh the fleet gauges every :data:`FLEET_REFRESH` seconds, until cancelled.

    ``toolkit_definition_unavailable_tasks`` and ``toolkit_tasks_held``: counted by one
    worker of the fleet per interval and read by the others (`Membership.fleet_counts`);
    each refresh runs through ``gate``, the supervisor's statement gate. A refresh that
    fails keeps the last values (the claim loop and heartbeats report outages).
    """
    while True:
        try:
            async with gate.statement():
                counts = await store.workers.fleet_counts(FLEET_REFRESH)
        except ToolkitError:
            pass
        else:
            metrics.definition_unavailable.clear()
            for (name, version), n in counts.unavailable.items():
                metrics.definition_unavailable.labels(name, str(version)).set(n)
            metrics.tasks_held.clear()
            for (name, reason), n in counts.held.items():
                metrics.tasks_held.labels(name, reason).set(n)
        await anyio.sleep(FLEET_REFRESH)
