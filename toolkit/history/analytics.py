"""Analyse exported history with DuckDB (``toolkit stats``, the notebooks, docs/history.md).

:func:`open` reads an export folder (see :mod:`toolkit.history.export`) into an in-memory DuckDB
connection with one view per exported table, each row once however many runs exported it:

- ``tasks``: the latest snapshot of each task;
- ``events``: every transition, with the task's ``tenant``, ``definition_name`` and
  ``definition_version``;
- ``effects``: every effect evidence record, with the same three task columns;
- ``checkpoints``: each checkpoint snapshot;
- ``schedules``: the newest exported snapshot of each schedule (its tick counters);
- ``emitted``: every event emitted (docs/events.md), with the tasks it started, was
  delivered to and cancelled;
- ``stream``: every item handlers published (docs/progress.md);

and derived views: ``queue_delays`` (one row per counted claim), ``effect_calls`` (one row
per effect outcome, with its duration), ``wait_spans`` (one row per durable wait) and
``schedule_lags`` (one row per task a schedule started, with its tick lag). The
methods of :class:`History` are the ready answers; each returns a lazy DuckDB relation
(``.fetchall()``, ``.df()`` with pandas, ``.show()``, or more SQL on top).

Times are UTC (the connection's ``TimeZone`` is set to UTC); durations are seconds. Runs
written by an older export schema read as NULL in the columns their files lack.
"""

from __future__ import annotations

import datetime
import functools
import importlib.resources
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import duckdb

from toolkit.errors import HistoryError
from toolkit.history.export import EXPORT_COLUMNS, TABLES, Manifest, read_manifest
from toolkit.store.queries import parse_named_blocks

VIEWS = ("tasks", "events", "effects", "checkpoints", "schedules", "emitted", "stream")
"""The table views of a history, one per exported table."""

DERIVED_VIEWS = ("queue_delays", "effect_calls", "wait_spans", "schedule_lags")
"""The derived views the answers are computed from."""


@functools.cache
def _sql() -> dict[str, str]:
    text = (importlib.resources.files("toolkit.history") / "sql" / "analytics.sql").read_text(
        encoding="utf-8"
    )
    return parse_named_blocks(text)


def _seconds(bucket: float | str) -> float:
    """A bucket width in seconds, from seconds or a duration string (``"1h"``)."""
    from toolkit.durations import parse_duration

    try:
        seconds = parse_duration(bucket)
    except ValueError as exc:
        raise HistoryError(f"bucket: {exc}") from exc
    if seconds <= 0:
        raise HistoryError("bucket: the width must be longer than 0 s")
    return seconds


_SCHEDULES_TITLE = "schedules (tick lag in seconds: task created minus its tick)"
_NO_SCHEDULES = "(no schedule and no scheduled task in this export)"


class History:
    """The exported history of a store, as DuckDB views and ready answers.

    Build one with :func:`open`. Not thread-safe (one DuckDB connection); close it with
    :meth:`close` or use it as a context manager.

    Attributes:
        path: the export folder.
        manifest: its manifest (runs, row counts, time range).
        con: the DuckDB connection; query the views with ``con.sql(...)``.
    """

    def __init__(self, path: Path, manifest: Manifest, con: duckdb.DuckDBPyConnection) -> None:
        self.path = path
        self.manifest = manifest
        self.con = con

    def _relation(self, name: str, bucket: float | str | None = None) -> duckdb.DuckDBPyRelation:
        params = None if bucket is None else {"bucket": _seconds(bucket)}
        relation = self.con.sql(_sql()[name], params=params)
        assert relation is not None
        return relation

    def table(self, name: str) -> duckdb.DuckDBPyRelation:
        """One of the views (`VIEWS` or `DERIVED_VIEWS`) as a relation.

        Raises:
            HistoryError: no view has that name.
        """
        if name not in VIEWS + DERIVED_VIEWS:
            raise HistoryError(
                f"no view {name!r}; the views are {', '.join(VIEWS + DERIVED_VIEWS)}"
            )
        return self.con.table(name)

    def queue_delay(self, bucket: float | str = 3600) -> duckdb.DuckDBPyRelation:
        """Queue delay percentiles by time bucket, definition, version and tenant.

        The queue delay of a claim is the time from when the task became due (submitted,
        released, retry delay over, reconciled, signalled) to the claim, by database time.

        Args:
            bucket: bucket width, seconds or a duration string (``"5m"``, ``"1h"``).

        Returns:
            Columns ``bucket`` (start, UTC), ``definition_name``, ``definition_version``,
            ``tenant``, ``claims``, ``p50_seconds``, ``p95_seconds``, ``p99_seconds``,
            ``max_seconds``.

        Raises:
            HistoryError: ``bucket`` is not a positive duration.
        """
        return self._relation("queue_delay", bucket)

    def queue_delay_over_time(self, bucket: float | str = 60) -> duckdb.DuckDBPyRelation:
        """Queue delay percentiles per time bucket over every definition and tenant.

        Args:
            bucket: bucket width, seconds or a duration string.

        Returns:
            Columns ``bucket``, ``claims``, ``p50_seconds``, ``p95_seconds``, ``p99_seconds``.

        Raises:
            HistoryError: ``bucket`` is not a positive duration.
        """
        return self._relation("queue_delay_over_time", bucket)

    def step_durations(self) -> duckdb.DuckDBPyRelation:
        """Execution time of effect steps, by definition, version and step.

        A call's time runs from the previous record of the same lease (the claim, or the
        evidence committed before the call) to the commit of its outcome, so it includes the
        commit's latency.

        Returns:
            Columns ``definition_name``, ``definition_version``, ``step``, ``handler``,
            ``calls``, ``completed``, ``failed``, ``mean_seconds``, ``p50_seconds``,
            ``p95_seconds``, ``max_seconds``.
        """
        return self._relation("step_durations")

    def lease_losses(self, bucket: float | str = 3600) -> duckdb.DuckDBPyRelation:
        """Takeovers of expired leases, by time bucket, definition, tenant and workers.

        Args:
            bucket: bucket width, seconds or a duration string.

        Returns:
            Columns ``bucket``, ``definition_name``, ``definition_version``, ``tenant``,
            ``lost_by`` (the worker whose lease expired), ``taken_by``, ``takeovers``,
            ``tasks``, ``attempts_lost`` (idempotent attempts found begun without a record).

        Raises:
            HistoryError: ``bucket`` is not a positive duration.
        """
        return self._relation("lease_losses", bucket)

    def retries(self) -> duckdb.DuckDBPyRelation:
        """Scheduled retries of effect steps, by step and the error that caused them.

        Returns:
            Columns ``definition_name``, ``definition_version``, ``step``, ``error_name``,
            ``retries``, ``tasks``, ``mean_delay_seconds``; most retries first.
        """
        return self._relation("retries")

    def failures(self) -> duckdb.DuckDBPyRelation:
        """Tasks that ended failed or cancelled, by the error they ended with.

        Returns:
            Columns ``definition_name``, ``definition_version``, ``state``, ``error_name``,
            ``step``, ``tasks``, ``first_at``, ``last_at``; most tasks first.
        """
        return self._relation("failures")

    def waits(self) -> duckdb.DuckDBPyRelation:
        """Time spent in durable waits, by reason, definition and tenant.

        A wait lasts from the event that started it to the next claim, takeover,
        reconciliation or cancellation of its task.

        Returns:
            Columns ``reason`` (signal, timer, child, reconciliation, budget, ...),
            ``definition_name``, ``definition_version``, ``tenant``, ``waits``, ``open``
            (still waiting at the last export, not in the times), ``total_seconds``,
            ``p50_seconds``, ``p95_seconds``, ``max_seconds``; most time first.
        """
        return self._relation("waits")

    def budget_spend(self) -> duckdb.DuckDBPyRelation:
        """What effects reported spending (``ctx.spend``), by tenant and resource.

        Returns:
            Columns ``tenant``, ``resource``, ``spent``, ``effects``, ``tasks``; no rows when
            no evidence record carries a spend (or the store had no spend column).
        """
        return self._relation("budget_spend")

    def throughput(self, bucket: float | str = 3600) -> duckdb.DuckDBPyRelation:
        """Tasks that ended, per time bucket, by how they ended.

        Args:
            bucket: bucket width, seconds or a duration string.

        Returns:
            Columns ``bucket``, ``definition_name``, ``definition_version``, ``tenant``,
            ``finished``, ``succeeded``, ``failed``, ``cancelled``.

        Raises:
            HistoryError: ``bucket`` is not a positive duration.
        """
        return self._relation("throughput", bucket)

    def schedules(self) -> duckdb.DuckDBPyRelation:
        """Ticks of each schedule: the runs it started, their tick lag, the ticks it missed.

        A run's tick lag is its task's creation minus the tick it was started for
        (``scheduled_at``), by database time: about 0 for a tick fired on time or a
        ``toolkit schedules trigger``, the downtime for a caught-up tick, the age of the tick
        for a backfill. ``skipped``, ``missed`` and ``caught_up`` are the schedule's own
        counters (since it was made) in the newest export snapshot that holds it; NULL for a
        schedule no snapshot holds (deleted before the first export of schema 2, or a folder
        exported by schema 1 only).

        Returns:
            Columns ``schedule``, ``definition_name``, ``fired`` (its tasks in the export),
            ``p50_seconds``, ``p95_seconds``, ``max_seconds`` (tick lag), ``skipped``,
            ``missed``, ``caught_up``; by schedule name. No rows when the export holds
            neither a scheduled task nor a schedule.
        """
        return self._relation("schedules")

    def summary(self) -> duckdb.DuckDBPyRelation:
        """Rows and time span of each table view.

        Returns:
            Columns ``table``, ``rows``, ``first_at``, ``last_at``.
        """
        return self._relation("summary")

    def report(self, bucket: float | str = 3600) -> str:
        """Every answer as readable text tables (what ``toolkit stats`` prints).

        Args:
            bucket: bucket width of the per-time answers, seconds or a duration string.

        Returns:
            Multi-line text: the export's time range, then one titled table per answer.

        Raises:
            HistoryError: ``bucket`` is not a positive duration.
        """
        start, end = self.manifest.time_range
        lines = [
            f"history in {self.path}: {len(self.manifest.runs)} export runs, "
            f"{cell_text(start) if start else 'from the start'} to {cell_text(end)}",
            "",
        ]
        sections = [
            ("rows", self.summary()),
            ("queue delay (seconds)", self.queue_delay(bucket)),
            ("step execution time (seconds)", self.step_durations()),
            ("lease losses and takeovers", self.lease_losses(bucket)),
            ("retries", self.retries()),
            ("failures", self.failures()),
            ("time waiting (seconds)", self.waits()),
            ("budget spend", self.budget_spend()),
            ("throughput (tasks ended)", self.throughput(bucket)),
            (_SCHEDULES_TITLE, self.schedules()),
        ]
        for title, relation in sections:
            empty = _NO_SCHEDULES if title == _SCHEDULES_TITLE else "(none)"
            lines += render_table(title, relation.columns, relation.fetchall(), empty=empty)
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"

    def close(self) -> None:
        """Close the DuckDB connection."""
        self.con.close()

    def __enter__(self) -> History:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_SHORT_NAMES = {
    "definition_name": "definition",
    "definition_version": "v",
    "p50_seconds": "p50",
    "p95_seconds": "p95",
    "p99_seconds": "p99",
    "max_seconds": "max",
    "mean_seconds": "mean",
    "total_seconds": "total",
    "mean_delay_seconds": "mean delay",
}


def cell_text(value: object) -> str:
    """A value as table text: times to the second (UTC), numbers to 3 decimals."""
    if value is None:
        return "-"
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    empty: str = "(none)",
) -> list[str]:
    """A titled plain-text table: a header, a rule, one line per row (``empty`` if none).

    Args:
        title: the line above the table.
        columns: column names (long names are shortened: ``definition_name`` → ``definition``).
        rows: the rows, each as long as ``columns``.
        empty: the line under the title when there are no rows.

    Returns:
        The lines, numbers right-aligned, text left-aligned.
    """
    header = [_SHORT_NAMES.get(name, name) for name in columns]
    cells = [[cell_text(value) for value in row] for row in rows]
    if not cells:
        return [title, f"  {empty}"]
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(columns))
    ]
    widths = [max(len(header[i]), *(len(row[i]) for row in cells)) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(widths[i]) if numeric[i] else value.ljust(widths[i])
            for i, value in enumerate(values)
        ]
        return "  " + "  ".join(parts).rstrip()

    return [title, line(header), "  " + "  ".join("-" * w for w in widths), *map(line, cells)]


_RUN_NUMBER = r"run-(\d+)\.parquet$"
"""The run number in a run file's name (`toolkit.history.export.RUN_FILE`)."""


def _raw_view(con: duckdb.DuckDBPyConnection, folder: Path, manifest: Manifest, table: str) -> None:
    """Make ``TABLE_raw``: every run's rows of a table, with exactly the pinned columns.

    A column the files of a run lack (written by an older export schema) reads as NULL. An
    ``export_run`` column says which run each row came from, so that a view can prefer the
    newer of two snapshots with the same time (a window exported again).
    """
    files = [str(folder / name) for name in manifest.files(table)]
    missing = [name for name in files if not Path(name).is_file()]
    if missing:
        raise HistoryError(f"{missing[0]}: listed in the manifest but missing")
    columns = EXPORT_COLUMNS[table]
    if files:
        relation = con.read_parquet(files, union_by_name=True, filename=True)
        present = set(relation.columns)
        run = duckdb.FunctionExpression(
            "regexp_extract",
            duckdb.ColumnExpression("filename"),
            duckdb.ConstantExpression(_RUN_NUMBER),
            duckdb.ConstantExpression(1),
        )
    else:
        relation, present, run = None, set(), duckdb.ConstantExpression(None)
    expressions = [
        duckdb.ColumnExpression(name).cast(duckdb.sqltype(kind)).alias(name)
        if name in present
        else duckdb.ConstantExpression(None).cast(duckdb.sqltype(kind)).alias(name)
        for name, kind in columns
    ]
    expressions.append(run.cast(duckdb.sqltype("INTEGER")).alias("export_run"))
    if relation is None:
        # No run yet: an empty view with the pinned columns.
        relation = con.sql("SELECT 1 AS one WHERE false")
        assert relation is not None
    relation.select(*expressions).create_view(f"{table}_raw")


def open(path: str | os.PathLike[str]) -> History:
    """Open an export folder for analysis.

    Args:
        path: a folder written by `toolkit.history.export.export_history` (``toolkit export``).

    Returns:
        A :class:`History` over an in-memory DuckDB connection; the Parquet files are read
        in place, when a query needs them.

    Raises:
        HistoryError: the folder has no manifest, one of an export schema version this
            toolkit does not read (a newer one), or a file the manifest lists is missing.
    """
    folder = Path(path)
    manifest = read_manifest(folder)
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        for table in TABLES:
            _raw_view(con, folder, manifest, table)
        statements = _sql()
        for name in (*VIEWS, *DERIVED_VIEWS):
            con.execute(statements[f"view_{name}"])
    except duckdb.Error as exc:
        con.close()
        raise HistoryError(f"{folder}: cannot read the export: {exc}") from exc
    except BaseException:
        con.close()
        raise
    return History(folder, manifest, con)
