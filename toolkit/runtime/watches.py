"""The watches a supervisor runs beside its claim loop.

Event-loop lag, and definitions no worker can run (DESIGN §5).
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
#: Seconds between two refreshes of the definition-unavailable gauge.
UNAVAILABLE_REFRESH = 15.0


async def watch_loop_lag(report: SupervisorReport, metrics: WorkerMetrics) -> None:
    """Measure how late the event loop wakes a sleeper (a stall), until cancelled."""
    while True:
        before = anyio.current_time()
        await anyio.sleep(LAG_INTERVAL)
        lag = max(anyio.current_time() - before - LAG_INTERVAL, 0.0)
        report.max_loop_lag = max(report.max_loop_lag, lag)
        metrics.loop_lag.observe(lag)


async def watch_unavailable(store: Store, metrics: WorkerMetrics, gate: StatementGate) -> None:
    """Refresh the definition-unavailable gauge now and then, until cancelled.

    Each refresh runs through ``gate``, the supervisor's statement gate.
    """
    gauge = metrics.definition_unavailable
    while True:
        try:
            async with gate.statement():
                counts = await store.definitions.unavailable()
        except ToolkitError:  # the claim loop and heartbeats report outages
            counts = None
        if counts is not None:
            gauge.clear()
            for (name, version), n in counts.items():
                gauge.labels(name, str(version)).set(n)
        await anyio.sleep(UNAVAILABLE_REFRESH)
