"""The hot-tenant run (``bench/hot_tenant.py``) in small: real worker processes, and a
small tenant that gets through a big one's backlog (docs/tenants.md)."""

from __future__ import annotations

from bench.hot_tenant import run_hot_tenant


def test_a_small_tenant_gets_through_a_hot_tenants_backlog(dsn: str) -> None:
    """Real worker processes: A queues 2,000 tasks, then B 20; B's tasks are claimed long
    before A's backlog is worked off."""
    result = run_hot_tenant(dsn, hot=2_000, cold=20, workers=1, concurrency=16, timeout=120)
    assert result.cold_hot.count == 20 and result.hot_delays.count == 2_000
    assert result.hot_backlog > 500  # B really arrived behind a backlog
    assert result.cold_hot.p50 < result.hot_delays.p50 / 4, result
    assert result.cold_window < result.fifo_estimate / 2, result
