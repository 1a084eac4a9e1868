"""The demo end to end against the test database: every task succeeds, effects run once."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from psycopg import sql

from tests.helpers.inprocess import invoke
from toolkit.examples import orders
from toolkit.ops.demo import DemoSummary, order_inputs, run_demo
from toolkit.store import Store

DEFINITIONS = Path(__file__).resolve().parents[2] / "definitions"
REVIEW_THRESHOLD = Decimal(1000)  # definitions/order-saga.yaml, step `route`


def _expected_effects() -> int:
    """4 effects per ingest task; 3 per order, plus the review of the large ones."""
    totals = [
        orders.price_order(o["items"]).total
        for o in order_inputs(DEFINITIONS / "data" / "orders.jsonl")
    ]
    return 72 * 4 + 300 * 3 + sum(total > REVIEW_THRESHOLD for total in totals)


def test_render_names_states_effects_time_and_reports() -> None:
    summary = DemoSummary(
        submitted={"order-saga": 300, "file-ingest": 72},
        tasks_by_state={"succeeded": 372},
        effects_run=1245,
        wall_time=2.0,
        report_dir="/tmp/r",
    )
    text = summary.render()
    assert "succeeded" in text and "372" in text
    assert "1245" in text
    assert "186.0 tasks/s" in text
    assert "/tmp/r" in text


@pytest.mark.anyio
async def test_demo_runs_every_task_to_success(store: Store, tmp_path: Path) -> None:
    lines: list[str] = []
    summary = await run_demo(
        store, DEFINITIONS, home=tmp_path, concurrency=8, progress=lines.append
    )

    assert summary.submitted == {"file-ingest": 72, "order-saga": 300}
    assert summary.tasks_by_state == {"succeeded": 372}
    # The story (issue 24, item 8): a worker process crashed right after a payment call, the
    # next took its tasks over, charges in flight failed closed and were reconciled from the
    # outbox, and a busy carrier's bookings were retried.
    assert summary.crash is not None and summary.crash.crashed, summary.crash
    assert summary.recovered >= 1
    assert summary.reconciled, "the crash left no charge waiting for reconciliation"
    assert summary.retried == sum(
        orders.carrier_busy(o["order_id"], 1)
        for o in order_inputs(DEFINITIONS / "data" / "orders.jsonl")
    )
    text = summary.render()
    assert "fail closed" in text and "reconciled   from the payment outbox" in text, text
    assert lines and lines[0].startswith("demo: a worker process runs"), lines
    assert summary.effects_run == _expected_effects()
    assert summary.report_dir == str((tmp_path / "reports").resolve())
    reports = sorted((tmp_path / "reports").iterdir())
    assert len(reports) == 72
    report = json.loads((tmp_path / "reports" / "oslo-blindern-2024.json").read_text())
    assert report["profile"]["rows"] == 366
    assert sorted(report["aggregates"]) == sorted(report["profile"]["numeric"])
    assert len(report["aggregates"]) == 5

    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*), count(DISTINCT idempotency_key) FROM demo_outbox"
        )
        assert await cursor.fetchone() == (300, 300)  # the non-idempotent charge ran once each
        for table in ("demo_inventory_reservations", "demo_shipments"):
            count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
            cursor = await conn.execute(count)
            assert await cursor.fetchone() == (300,)

    # A second run on the same database counts only its own tasks; reports are rewritten.
    again = await run_demo(store, DEFINITIONS, home=tmp_path, concurrency=8, crash=False)
    assert again.tasks_by_state == {"succeeded": 372}
    assert again.effects_run == summary.effects_run
    assert len(list((tmp_path / "reports").iterdir())) == 72
    # and the patterns of branches that wait, each run: 7 tasks (a child among them), of
    # which one request is refused; and the shop's events, once: 10 orders started by
    # order.placed, 8 paid and 2 cancelled (the second run's orders repeat the event keys)
    assert await store.tasks.counts_by_state() == {
        "succeeded": 744 + 2 * 6 + 8, "failed": 2, "cancelled": 2,
    }  # fmt: skip
    assert again.patterns is not None
    assert "branches that wait" in again.render()
    assert summary.events is not None and again.events is not None
    assert (summary.events.started, summary.events.duplicates) == (10, 1), summary.events
    assert summary.events.states == {"succeeded": 8, "cancelled": 2}, summary.events
    assert summary.events.cancelled == 2, summary.events
    # paid early (3, found as they started), paid later (5, delivered by the emit itself to
    # the tasks that had subscribed), cancelled (2)
    assert summary.events.delivered == 5, summary.events
    assert (again.events.started, again.events.duplicates) == (0, 11), again.events
    assert "events (" in summary.render()


def test_the_demo_command_shows_its_story_without_tracebacks(dsn: str, tmp_path: Path) -> None:
    """The busy carrier's failed attempts are planned and counted in the summary: the worker's
    warnings for them (each with a traceback) must not make the demo look broken."""
    code, out, err = invoke(dsn, "--home", str(tmp_path), "demo", "--definitions", str(DEFINITIONS))
    assert code == 0, err
    assert "retries      " in out and "a busy carrier" in out, out
    assert "Traceback" not in err and "effect_failed" not in err, err
    assert all(line.startswith("demo: ") for line in err.splitlines()), err
