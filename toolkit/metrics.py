"""Prometheus metrics of a worker process (DESIGN §5, "Metrics").

Names follow Prometheus conventions, with units in the name (``_seconds``, ``_total``). Each
:class:`WorkerMetrics` owns its own registry, so several supervisors in one process (tests,
notebooks) never collide; ``toolkit run --metrics-port`` serves it over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

#: Buckets for delays and durations, seconds: 1 ms to 10 minutes.
_SECONDS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    600,
)


class _PoolCollector(Collector):
    """Reads the connection pool's own statistics at scrape time."""

    def __init__(self, stats: Callable[[], Mapping[str, int]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._stats()
        yield GaugeMetricFamily(
            "toolkit_db_pool_connections", "Connections in the pool.", stats.get("pool_size", 0)
        )
        yield GaugeMetricFamily(
            "toolkit_db_pool_available_connections",
            "Idle connections in the pool.",
            stats.get("pool_available", 0),
        )
        yield GaugeMetricFamily(
            "toolkit_db_pool_waiting_requests",
            "Requests waiting for a connection now.",
            stats.get("requests_waiting", 0),
        )
        yield CounterMetricFamily(
            "toolkit_db_pool_wait_seconds",
            "Time spent waiting for a pool connection.",
            stats.get("requests_wait_ms", 0) / 1000,
        )


class WorkerMetrics:
    """The metrics one supervisor records.

    Args:
        pool_stats: a callable returning the pool's statistics (``get_stats()``), read at
            scrape time; None to leave the pool out.
    """

    def __init__(self, pool_stats: Callable[[], Mapping[str, int]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_delay = Histogram(
            "toolkit_queue_delay_seconds",
            "Time from a task's run_at to its claim, database time.",
            ["definition"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.claim_latency = Histogram(
            "toolkit_claim_latency_seconds", "Duration of one claim statement.",
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.claimed = Counter(
            "toolkit_tasks_claimed_total", "Tasks claimed, takeovers included.",
            ["definition", "recovered"], registry=r,
        )  # fmt: skip
        self.step_duration = Histogram(
            "toolkit_step_duration_seconds", "Duration of one effect call.",
            ["definition", "step", "outcome"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.cycle_duration = Histogram(
            "toolkit_cycle_duration_seconds", "Duration of one claim-and-execute cycle.",
            ["definition", "outcome"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.cycles = Counter(
            "toolkit_cycles_total", "Cycles finished, by outcome.",
            ["definition", "outcome"], registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "toolkit_retries_total", "Effect retries scheduled.", ["definition"], registry=r
        )
        self.failures = Counter(
            "toolkit_failures_total", "Tasks ended failed.", ["definition"], registry=r
        )
        self.waits = Counter(
            "toolkit_waits_total", "Tasks that started waiting, by reason.",
            ["definition", "reason"], registry=r,
        )  # fmt: skip
        self.lease_renewals = Counter(
            "toolkit_lease_renewals_total", "Leases renewed by heartbeats.", registry=r
        )
        self.lease_losses = Counter(
            "toolkit_lease_losses_total", "Leases found lost (heartbeat or fenced write).",
            registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            "toolkit_cycles_in_flight", "Claim-and-execute cycles running now.", registry=r
        )
        self.definition_unavailable = Gauge(
            "toolkit_definition_unavailable_tasks",
            "Live tasks whose definition version no live worker has loaded.",
            ["definition", "version"], registry=r,
        )  # fmt: skip
        self.tasks_held = Gauge(
            "toolkit_tasks_held",
            "Live tasks held back now, by definition and reason: concurrency (their key is "
            "busy), debounce, start (a delayed or throttled start), budget, limit (not due "
            "yet), tenant_paused, tenant_max_active (due, their tenant paused or at its "
            "max_active). The whole fleet's, counted every 15 s by one worker of the fleet.",
            ["definition", "reason"], registry=r,
        )  # fmt: skip
        self.database_outages = Counter(
            "toolkit_database_outages_total", "Times the database became unreachable.",
            registry=r,
        )  # fmt: skip
        self.listen_reconnects = Counter(
            "toolkit_listen_reconnects_total",
            "Times the LISTEN connection was opened again: it dropped, or stopped answering "
            "its probe (a half-open connection).",
            registry=r,
        )  # fmt: skip
        self.loop_lag = Histogram(
            "toolkit_event_loop_lag_seconds", "Event-loop stall (runtime stall) per check.",
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.limit_deferrals = Counter(
            "toolkit_limit_deferrals_total",
            "Effect steps not started because a downstream limit was full, by limit.",
            ["definition", "limit"], registry=r,
        )  # fmt: skip
        self.limit_wait = Histogram(
            "toolkit_limit_wait_seconds",
            "Time a step waited for a downstream limit, from its first deferral to the "
            "acquisition that let it run, database time.",
            ["definition", "limit"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.ticks = Counter(
            "toolkit_schedule_ticks_total",
            "Schedule ticks by what became of them: fired (started a run), skipped (the "
            "overlap policy), missed (the catch-up policy), caught_up (missed, fired anyway).",
            ["schedule", "outcome"], registry=r,
        )  # fmt: skip
        self.tick_lag = Histogram(
            "toolkit_schedule_tick_lag_seconds",
            "Fire time minus tick time of each tick that started a run, database time.",
            ["schedule"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        if pool_stats is not None:
            r.register(_PoolCollector(pool_stats))
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: MetricWrapperBase, *values: str) -> Any:
        """``metric.labels(*values)``, kept: for the metrics counted on every cycle.

        prometheus_client checks the values and takes a lock on every ``labels`` call (2 %
        of a busy worker's CPU); the children are the same ones it keeps. Not for a metric
        whose children are cleared (``toolkit_tasks_held``): a kept child would be stale.
        """
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread.

        Raises:
            OSError: the port cannot be bound.
        """
        start_http_server(port, addr=addr, registry=self.registry)
