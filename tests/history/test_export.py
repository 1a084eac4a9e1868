"""History export to Parquet, DuckDB analytics over it, and `toolkit export` / `toolkit stats`."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tests.helpers.history import deploy, run_until_idle, submit_and_run, with_store
from tests.helpers.workflows import DEFINITIONS, FLOW, WAITER
from toolkit import history
from toolkit.cli import cli
from toolkit.definition import load_definition, parse_definition
from toolkit.errors import HistoryError
from toolkit.history.export import (
    EXPORT_COLUMNS,
    EXPORT_SCHEMA_VERSION,
    TABLES,
    export_history,
    read_manifest,
)
from toolkit.store import Store

pytestmark = pytest.mark.anyio


# --- export -----------------------------------------------------------------------------------


def test_the_export_schema_is_pinned() -> None:
    """Changing a column is a new export schema version: update this test, the docs and
    EXPORT_SCHEMA_VERSION together."""
    assert EXPORT_SCHEMA_VERSION == 5
    assert {table: [name for name, _ in cols] for table, cols in EXPORT_COLUMNS.items()} == {
        "tasks": [
            "id", "tenant", "definition_name", "definition_version", "definition_digest",
            "state", "wait_reason", "attempts", "lease_token", "parent_id", "idempotency_key",
            "input", "result", "error", "created_at", "run_at", "updated_at", "finished_at",
            "schedule_name", "scheduled_at", "tags", "parent_occurrence", "map_index",
        ],
        "events": ["id", "task_id", "kind", "worker_id", "fencing_token", "detail", "at"],
        "effects": [
            "id", "task_id", "occurrence", "step", "handler", "idempotent", "idempotency_key",
            "record", "attempt", "fencing_token", "worker_id", "result", "error", "spend",
            "recorded_at",
        ],
        "checkpoints": [
            "task_id", "lease_token", "definition_digest", "state", "cursor", "pending",
            "wait", "checkpoint", "updated_at",
        ],
        "schedules": [
            "name", "definition_name", "owner", "tenant", "cadence", "overlap", "catchup",
            "paused", "fired", "skipped", "missed", "caught_up", "next_tick", "last_tick",
            "created_at", "exported_at",
        ],
        "emitted": [
            "id", "tenant", "name", "key", "payload", "emitted_at", "started", "delivered",
            "cancelled",
        ],
        "stream": ["task_id", "seq", "occurrence", "fencing_token", "value", "published_at"],
    }  # fmt: skip
    page = (Path(__file__).parent.parent.parent / "docs" / "history.md").read_text()
    for table, cols in EXPORT_COLUMNS.items():
        for name, kind in cols:
            assert f"| `{name}` | `{kind}` |" in page, f"docs/history.md: {table}.{name}"


async def test_export_writes_parquet_and_a_manifest(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    await submit_and_run(store)
    out = tmp_path / "hist"
    run = await export_history(store.db, out)

    assert run.number == 1 and run.since is None
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "runifold-history"
    assert manifest["schema_version"] == EXPORT_SCHEMA_VERSION
    assert manifest["rows"] == run.rows
    assert manifest["time_range"]["until"] == run.until.isoformat()
    assert [r["number"] for r in manifest["runs"]] == [1]
    assert run.rows["tasks"] == 4 and run.rows["checkpoints"] == 4
    counts = {
        "events": "SELECT count(*) FROM toolkit_task_events",
        "effects": "SELECT count(*) FROM toolkit_effect_evidence",
    }
    for table, sql in counts.items():
        async with store.db.connection() as conn:
            row = await (await conn.execute(sql)).fetchone()
        assert row is not None and run.rows[table] == row[0]

    con = duckdb.connect()
    events = con.read_parquet(str(out / run.files["events"]))
    assert events.columns == [name for name, _ in EXPORT_COLUMNS["events"]]
    claims = con.sql(
        "SELECT worker_id, fencing_token FROM read_parquet($p) WHERE kind = 'claimed'",
        params={"p": str(out / run.files["events"])},
    )
    assert claims is not None
    rows = claims.fetchall()
    assert rows and all(w == "history-test-worker" and token >= 1 for w, token in rows)
    types = dict(zip(events.columns, events.types, strict=True))
    assert str(types["at"]) == "TIMESTAMP WITH TIME ZONE" and str(types["detail"]) == "JSON"


async def test_a_second_export_adds_only_newer_rows(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    await submit_and_run(store, flows=2, broken=0)
    out = tmp_path / "hist"
    first = await export_history(store.db, out)
    again = await export_history(store.db, out)  # nothing happened since
    assert again.since == first.until
    assert again.rows == {
        "tasks": 0, "events": 0, "effects": 0, "checkpoints": 0, "schedules": 0, "emitted": 0,
        "stream": 0,
    }  # fmt: skip

    await submit_and_run(store, flows=1, broken=0)
    third = await export_history(store.db, out, since=again.until)
    assert third.rows["tasks"] == 1 and third.rows["events"] > 0
    manifest = read_manifest(out)
    assert [r.number for r in manifest.runs] == [1, 2, 3]
    assert manifest.rows["tasks"] == 3
    with history.open(out) as h:
        assert h.table("tasks").count("*").fetchall() == [(3,)]
        # A run over the same window again does not double anything in the views.
    await export_history(store.db, out, since=first.since or datetime.datetime(2000, 1, 1))
    with history.open(out) as h:
        assert h.table("tasks").count("*").fetchall() == [(3,)]
        total = read_manifest(out).rows["events"]
        assert h.table("events").count("*").fetchall()[0][0] < total


async def test_export_refuses_another_schema_version(store: Store, tmp_path: Path) -> None:
    await export_history(store.db, tmp_path)
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["schema_version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(HistoryError, match=r"export schema version 99"):
        await export_history(store.db, tmp_path)
    with pytest.raises(HistoryError, match=r"export schema version 99"):
        history.open(tmp_path)
    with pytest.raises(HistoryError, match=r"no manifest\.json"):
        history.open(tmp_path / "nowhere")


# --- analytics --------------------------------------------------------------------------------


async def exported(store: Store, out: Path) -> None:
    await deploy(store)
    await submit_and_run(store)
    [waiter] = await store.tasks.submit(WAITER, [{}], tenant="acme")
    await run_until_idle(store, DEFINITIONS)  # it waits for its signal
    await store.tasks.signal(waiter, "go")
    await run_until_idle(store, DEFINITIONS)
    await export_history(store.db, out)


async def test_every_answer_is_a_relation_with_its_columns(store: Store, tmp_path: Path) -> None:
    await exported(store, tmp_path)
    with history.open(tmp_path) as h:
        answers = {
            "queue_delay": h.queue_delay("1h"),
            "step_durations": h.step_durations(),
            "lease_losses": h.lease_losses(60),
            "retries": h.retries(),
            "failures": h.failures(),
            "waits": h.waits(),
            "budget_spend": h.budget_spend(),
            "throughput": h.throughput("1m"),
            "summary": h.summary(),
        }
        for name, relation in answers.items():
            assert isinstance(relation, duckdb.DuckDBPyRelation), name

        delay = answers["queue_delay"]
        assert delay.columns == [
            "bucket", "definition_name", "definition_version", "tenant", "claims",
            "p50_seconds", "p95_seconds", "p99_seconds", "max_seconds",
        ]  # fmt: skip
        rows = {(r[1], r[3]): r for r in delay.fetchall()}
        flow = rows[("hist-flow", "acme")]
        # 3 first claims, 3 claims after the retry delay, 1 + 1 for the waiter.
        assert flow[4] == 3 + 3
        assert 0 <= flow[5] <= flow[6] <= flow[7] <= flow[8] < 30
        assert rows[("hist-wait", "acme")][4] == 2

        steps = {r[2]: r for r in answers["step_durations"].fetchall()}
        assert steps["first"][4:7] == (3, 3, 0)  # calls, completed, failed
        assert steps["second"][4:7] == (6, 3, 3)
        assert all(r[7] is not None and r[7] >= 0 for r in steps.values())

        retries = answers["retries"].fetchall()
        assert [(r[0], r[2], r[3], r[4], r[5]) for r in retries] == [
            ("hist-flow", "second", "RuntimeError", 3, 3)
        ]
        failures = answers["failures"].fetchall()
        assert [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in failures] == [
            ("hist-broken", 2, "failed", "ValueError", "only", 1)
        ]
        waits = answers["waits"].fetchall()
        assert [(r[0], r[1], r[4], r[5]) for r in waits] == [("signal", "hist-wait", 1, 0)]
        assert waits[0][6] > 0

        spend = answers["budget_spend"]
        assert spend.columns == ["tenant", "resource", "spent", "effects", "tasks"]
        assert spend.fetchall() == [("acme", "tokens", 30.0, 3, 3)]

        throughput = answers["throughput"].fetchall()
        assert sum(r[4] for r in throughput) == 5
        assert sum(r[6] for r in throughput) == 1

        summary = dict((r[0], r[1]) for r in answers["summary"].fetchall())
        assert summary["tasks"] == 5 and summary["checkpoints"] == 5
        assert list(summary) == list(TABLES), summary  # every exported table (not 5 of 7)

        assert answers["lease_losses"].fetchall() == []


async def test_a_wait_for_the_first_event_has_the_reason_its_task_waited_with(
    store: Store, tmp_path: Path
) -> None:
    """A wait for a signal or a timer is a ``signal`` wait; one for timers only, ``timer``."""
    first_event = parse_definition(
        """
name: hist-first-event
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {any: [{signal: go, next: done}, {duration: 1h, next: done}]}}
  done: {succeed: {output: ok}}
""",
        source="<hist-first-event>",
    )
    timers = parse_definition(
        """
name: hist-timers
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {any: [{duration: 1h, next: done}, {duration: 2h, next: done}]}}
  done: {succeed: {output: ok}}
""",
        source="<hist-timers>",
    )
    event = parse_definition(
        """
name: hist-event
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {event: paid, match: {order: "${ input.order }"}}}
""",
        source="<hist-event>",
    )
    for d in (first_event, timers, event):
        await store.definitions.deploy(d)
        await store.tasks.submit(d, [{"order": "o-1"}])
    await run_until_idle(store, [first_event, timers, event])
    assert {t.wait_reason for t in await store.tasks.list(state="waiting")} == {"signal", "timer"}
    await export_history(store.db, tmp_path)
    with history.open(tmp_path) as h:
        reasons = {(r[1], r[0]) for r in h.waits().fetchall()}
    # (an event wait was "other", though its task waits with reason signal)
    assert reasons == {
        ("hist-first-event", "signal"), ("hist-timers", "timer"), ("hist-event", "signal")
    }


async def test_lease_losses_count_takeovers(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    [task_id] = await store.tasks.submit(FLOW, [{"n": 1}], tenant="acme")
    claimed = await store.leases.claim("crashed-worker", [FLOW.digest], limit=1, lease_seconds=30)
    assert [t.id for t in claimed] == [task_id]
    async with store.db.connection() as conn:  # the holder vanished: its lease runs out
        await conn.execute(
            "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() - interval '1 s'"
        )
    await run_until_idle(store, DEFINITIONS)
    await export_history(store.db, tmp_path)
    with history.open(tmp_path) as h:
        losses = h.lease_losses("1d").fetchall()
    assert [(r[1], r[3], r[4], r[5], r[6], r[7]) for r in losses] == [
        ("hist-flow", "acme", "crashed-worker", "history-test-worker", 1, 1)
    ]


async def test_budget_spend_is_empty_without_spend(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    await submit_and_run(store, flows=0, broken=1)
    await export_history(store.db, tmp_path)
    with history.open(tmp_path) as h:
        assert h.budget_spend().fetchall() == []
        with pytest.raises(HistoryError, match="bucket"):
            h.queue_delay("soon")


def test_an_empty_export_folder_has_empty_views(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(
        json.dumps({"format": "runifold-history", "schema_version": 1, "runs": []})
    )
    with history.open(tmp_path) as h:
        assert h.queue_delay().fetchall() == []
        assert h.table("events").columns[:3] == ["id", "task_id", "kind"]


# --- CLI: export and stats --------------------------------------------------------------------


def test_cli_export_and_stats(dsn: str, tmp_path: Path) -> None:
    with_store(dsn, lambda store: exported(store, tmp_path / "unused"))
    out = tmp_path / "cli"
    runner = CliRunner()
    result = runner.invoke(cli, ["--dsn", dsn, "export", str(out)])
    assert result.exit_code == 0, result.output
    assert "exported run 1 to" in result.output and "tasks" in result.output
    result = runner.invoke(cli, ["--dsn", dsn, "export", str(out), "--since", "2000-01-01"])
    assert result.exit_code == 0, result.output
    assert "exported run 2" in result.output

    result = runner.invoke(cli, ["stats", str(out)])
    assert result.exit_code == 0, result.output
    for title in (
        "queue delay", "step execution time", "lease losses", "retries", "failures",
        "time waiting", "budget spend",
    ):  # fmt: skip
        assert title in result.output, title
    assert "hist-flow" in result.output and "RuntimeError" in result.output

    result = runner.invoke(cli, ["stats", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and "Traceback" not in result.output
    result = runner.invoke(cli, ["--dsn", dsn, "export", str(out), "--since", "yesterday"])
    assert result.exit_code != 0 and "Traceback" not in result.output


async def test_the_events_emitted_are_exported_with_what_they_did(
    store: Store, tmp_path: Path
) -> None:
    definition = load_definition(Path(__file__).parents[2] / "definitions" / "order-events.yaml")
    await store.definitions.deploy(definition)
    placed = await store.events.emit("order.placed", {"order_id": "o-1", "total": 5}, key="k")
    await store.events.emit("payment.settled", {"order_id": "elsewhere"})
    await export_history(store.db, tmp_path / "hist")
    with history.open(tmp_path / "hist") as h:
        rows = h.table("emitted").order("id").fetchall()
    assert [(r[2], r[3], json.loads(r[6])) for r in rows] == [
        ("order.placed", "k", list(placed.started)), ("payment.settled", None, []),
    ]  # fmt: skip


async def test_the_items_handlers_published_are_exported_in_order(
    store: Store, tmp_path: Path
) -> None:
    await deploy(store)
    await store.tasks.submit(FLOW, [{"n": 1}])
    (task,) = await store.leases.claim("w1", [FLOW.digest], 1, 30)
    for n in range(3):
        await store.streams.publish(task.fence("w1"), "generate#1", {"token": n})
    run = await export_history(store.db, tmp_path / "hist")
    assert run.rows["stream"] == 3
    with history.open(tmp_path / "hist") as h:
        rows = h.table("stream").order("seq").fetchall()
    assert [(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows] == [
        (task.id, n + 1, "generate#1", 1, {"token": n}) for n in range(3)
    ]
