"""Schedules in the history export (schema version 2): the tasks' schedule columns, the
schedules snapshot, the schedules answer of `toolkit stats`, and folders of version 1."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

from tests.helpers.inprocess import sql
from tests.helpers.workflows import definition
from toolkit import history
from toolkit.cli import cli
from toolkit.history.export import EXPORT_COLUMNS, export_history, read_manifest
from toolkit.store import Store

pytestmark = pytest.mark.anyio

REPORT = definition(
    """
name: hist-report
version: 1
input: {type: object}
start: done
steps:
  done: {succeed: {output: ok}}
"""
)

#: The columns version 2 added to ``tasks``; version 1 had the others, in the same order.
ADDED = ("schedule_name", "scheduled_at", "tags")
#: Columns of ``tasks`` added after version 2 (version 5: a distributed map's item rows).
ADDED_LATER = ("parent_occurrence", "map_index")


async def scheduled(store: Store) -> None:
    """Three schedules and a plain task: ``hourly`` backfilled and triggered, ``minutely``
    down for ten minutes and caught up, ``daily`` never due."""
    await store.definitions.deploy(REPORT)
    await store.tasks.submit(REPORT, [{}])
    await store.schedules.create("hourly", "hist-report", every="1h", tags={"team": "ops"},
                                 overlap="allow_all")  # fmt: skip
    now = await store.tasks.database_now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    backfilled = await store.schedules.backfill(
        "hourly", hour - datetime.timedelta(hours=4), hour - datetime.timedelta(hours=1)
    )
    assert len(backfilled) == 3
    await store.schedules.trigger("hourly")
    await store.schedules.create("minutely", "hist-report", every="1m", overlap="allow_all")
    await sql(  # row surgery: no worker ran for ten minutes (no sleeping)
        store,
        "UPDATE toolkit_schedules SET next_tick = toolkit_seconds_after(next_tick, -600)"
        " WHERE name = 'minutely'",
    )
    await store.schedules.fire_due(["hist-report"])
    await store.schedules.create("daily", "hist-report", every="1d")


async def expected_lags(store: Store) -> dict[str, tuple[Any, ...]]:
    """Per schedule: runs, p50, p95 and max tick lag, computed by PostgreSQL."""
    rows = await sql(
        store,
        """
        SELECT schedule_name, count(*),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY lag), max(lag)
        FROM (SELECT schedule_name,
                     greatest(extract(epoch FROM created_at - scheduled_at), 0)::float8 AS lag
              FROM toolkit_tasks WHERE schedule_name IS NOT NULL) runs
        GROUP BY schedule_name
        """,
    )
    return {row[0]: row[1:] for row in rows}


async def test_scheduled_tasks_export_their_schedule_tick_and_tags(
    store: Store, tmp_path: Path
) -> None:
    await scheduled(store)
    run = await export_history(store.db, tmp_path)
    assert run.schema_version == 5 and run.rows["schedules"] == 3

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    tasks = con.read_parquet(str(tmp_path / run.files["tasks"]))
    assert tasks.columns == [name for name, _ in EXPORT_COLUMNS["tasks"]]
    types = dict(zip(tasks.columns, tasks.types, strict=True))
    assert str(types["scheduled_at"]) == "TIMESTAMP WITH TIME ZONE"
    assert str(types["tags"]) == "JSON"
    exported = {
        row[0]: row[1:] for row in tasks.select("id, schedule_name, scheduled_at, tags").fetchall()
    }
    stored = await sql(store, "SELECT id, schedule_name, scheduled_at, tags FROM toolkit_tasks")
    assert len(exported) == len(stored) >= 6
    for task_id, name, tick, tags in stored:
        assert exported[task_id][:2] == (name, tick), task_id
        assert json.loads(exported[task_id][2]) == tags, task_id
    assert sum(1 for name, *_ in exported.values() if name is None) == 1
    assert {
        json.loads(tags)["team"] for name, _, tags in exported.values() if name == "hourly"
    } == {"ops"}

    snapshot = con.read_parquet(str(tmp_path / run.files["schedules"]))
    assert snapshot.columns == [name for name, _ in EXPORT_COLUMNS["schedules"]]
    counters = {
        row[0]: row[1:]
        for row in snapshot.select(
            "name, fired, skipped, missed, caught_up, exported_at"
        ).fetchall()
    }
    for schedule in await store.schedules.list():
        assert counters[schedule.name][:4] == (
            schedule.fired, schedule.skipped, schedule.missed, schedule.caught_up
        )  # fmt: skip
        assert counters[schedule.name][4] == run.exported_at
    assert counters["minutely"][2] >= 8 and counters["minutely"][3] == 1


async def test_stats_reports_tick_lag_and_missed_ticks(store: Store, tmp_path: Path) -> None:
    await scheduled(store)
    await export_history(store.db, tmp_path)
    lags = await expected_lags(store)
    made = {schedule.name: schedule for schedule in await store.schedules.list()}

    with history.open(tmp_path) as h:
        answer = h.schedules()
        assert answer.columns == [
            "schedule", "definition_name", "fired", "p50_seconds", "p95_seconds",
            "max_seconds", "skipped", "missed", "caught_up",
        ]  # fmt: skip
        rows = {row[0]: row[1:] for row in answer.fetchall()}
        report = h.report()
    assert set(rows) == {"daily", "hourly", "minutely"}
    for name in ("hourly", "minutely"):
        fired, p50, p95, most = lags[name]
        assert rows[name][:2] == ("hist-report", fired)
        assert rows[name][2:5] == pytest.approx((p50, p95, most), abs=1e-5)
        schedule = made[name]
        assert rows[name][5:] == (schedule.skipped, schedule.missed, schedule.caught_up)
    # Three backfilled ticks, one to four hours old, and a trigger: lag about 0.
    assert rows["hourly"][1] == 4 and 3600 <= rows["hourly"][4] < 5 * 3600
    assert rows["minutely"][6] >= 8  # missed
    assert rows["daily"] == ("hist-report", 0, None, None, None, 0, 0, 0)

    assert "schedules (tick lag in seconds: task created minus its tick)" in report
    line = next(line for line in report.splitlines() if line.startswith("  minutely "))
    assert line.split()[-3:] == [str(made["minutely"].skipped), str(made["minutely"].missed), "1"]

    result = CliRunner().invoke(cli, ["stats", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert line in result.output


async def test_an_export_without_schedules_says_so(store: Store, tmp_path: Path) -> None:
    await store.definitions.deploy(REPORT)
    await store.tasks.submit(REPORT, [{}])
    await export_history(store.db, tmp_path)
    with history.open(tmp_path) as h:
        assert h.schedules().fetchall() == []
        report = h.report()
    assert (
        "schedules (tick lag in seconds: task created minus its tick)\n"
        "  (no schedule and no scheduled task in this export)\n"
    ) in report


# --- a folder written by export schema version 1 ---------------------------------------------


def as_version_1(folder: Path) -> None:
    """Rewrite an export folder as export schema version 1 wrote it: tasks without the new
    columns, no schedules files, no run versions in the manifest, the old pinned columns."""
    manifest = json.loads((folder / "manifest.json").read_text())
    con = duckdb.connect()
    for run in manifest["runs"]:
        path = folder / run["files"]["tasks"]
        old = con.read_parquet(str(path)).select(
            ", ".join(f'"{name}"' for name, _ in EXPORT_COLUMNS["tasks"]
                      if name not in (*ADDED, *ADDED_LATER))
        )
        old.write_parquet(str(path.with_suffix(".old")), compression="zstd")
        path.with_suffix(".old").replace(path)
        (folder / run["files"].pop("schedules")).unlink()
        del run["rows"]["schedules"], run["schema_version"]
    manifest["schema_version"] = 1
    manifest["tables"] = {
        table: [pair for pair in cols if pair[0] not in (*ADDED, *ADDED_LATER)]
        for table, cols in manifest["tables"].items()
        if table != "schedules"
    }
    del manifest["rows"]["schedules"]
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


async def test_a_version_1_folder_still_opens_and_reports(store: Store, tmp_path: Path) -> None:
    await scheduled(store)
    await export_history(store.db, tmp_path)
    as_version_1(tmp_path)
    assert (
        "tags"
        not in duckdb.connect().read_parquet(str(tmp_path / "tasks/run-00001.parquet")).columns
    )

    manifest = read_manifest(tmp_path)
    assert manifest.schema_version == 1 and manifest.runs[0].schema_version == 1
    with history.open(tmp_path) as h:
        tasks = h.table("tasks")
        assert tasks.columns[-5:] == [*ADDED, *ADDED_LATER]
        assert tasks.filter("schedule_name IS NOT NULL OR tags IS NOT NULL").count(
            "*"
        ).fetchall() == [(0,)]
        assert h.table("schedules").count("*").fetchall() == [(0,)]
        assert h.schedules().fetchall() == []
        report = h.report()
    assert "(no schedule and no scheduled task in this export)" in report
    assert "throughput (tasks ended)" in report


async def test_a_version_4_run_appends_to_a_version_1_folder(store: Store, tmp_path: Path) -> None:
    await scheduled(store)
    first = await export_history(store.db, tmp_path)
    as_version_1(tmp_path)
    await store.schedules.trigger("daily")

    # The next run adds only what changed since: the new trigger's task.
    second = await export_history(store.db, tmp_path)
    manifest = read_manifest(tmp_path)
    assert manifest.schema_version == 5
    assert [run.schema_version for run in manifest.runs] == [1, 5]
    assert "schedules" not in manifest.runs[0].files and second.rows["schedules"] == 3
    saved = json.loads((tmp_path / "manifest.json").read_text())
    assert saved["schema_version"] == 5 and saved["runs"][0]["schema_version"] == 1
    with history.open(tmp_path) as h:
        rows = {row[0]: row[1:] for row in h.schedules().fetchall()}
    assert rows["daily"][1] == 1  # its run has the columns
    assert rows["hourly"][1] == 0  # exported by version 1 only: no schedule in its row
    assert rows["minutely"][6] >= 8  # the counters come from the new run's snapshot

    # Exporting the first window again fills the old tasks' columns: of two snapshots of a
    # task with the same time, the newer run's wins.
    await export_history(store.db, tmp_path, since=first.since or datetime.datetime(2000, 1, 1))
    lags = await expected_lags(store)
    with history.open(tmp_path) as h:
        rows = {row[0]: row[1:] for row in h.schedules().fetchall()}
        assert h.table("tasks").count("*").fetchall() == [(first.rows["tasks"] + 1,)]
    assert {name: row[1] for name, row in rows.items()} == {
        name: lags[name][0] for name in ("daily", "hourly", "minutely")
    }
