"""Export the store's history to Parquet through DuckDB (``toolkit export``, docs/history.md).

An export folder holds one Parquet file per table per export run (``tasks/run-00001.parquet``
...) and ``manifest.json``, which lists the runs: their time window, row counts and files.
Exports are incremental: each run reads the rows whose time lies in ``[since, until)``, where
``since`` defaults to the previous run's ``until``, and adds new files; nothing already
written is rewritten. ``until`` is a horizon the database guarantees no later commit can
reach under (see the ``export_horizon`` query), so consecutive runs miss no row.

Rows are read with ``COPY ... TO STDOUT`` (CSV) from one REPEATABLE READ snapshot and written
to Parquet by DuckDB with the pinned column types of `EXPORT_COLUMNS`. The ``schedules``
table is a snapshot of every schedule at the run's time, not a window.

A folder written by an older export schema (`READABLE_SCHEMA_VERSIONS`) is read and appended
to: each run records the version it was written with, and a column its files lack reads as
NULL (docs/decisions.md, "History export of schedules").
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb

from toolkit.errors import HistoryError
from toolkit.store.database import Database
from toolkit.store.queries import query

EXPORT_SCHEMA_VERSION = 5
"""Version of the export layout: the tables, their columns and types, and the manifest.

1: tasks, events, effects, checkpoints. 2: ``tasks`` gains ``schedule_name``,
``scheduled_at`` and ``tags``; a ``schedules`` snapshot table; each run records its version.
3: an ``emitted`` table, the events emitted (docs/events.md). 4: a ``stream`` table, the
items handlers published (docs/progress.md). 5: ``tasks`` gains ``parent_occurrence`` and
``map_index``: a distributed map's per-item rows (docs/composition.md#distributed-map).
"""

READABLE_SCHEMA_VERSIONS = frozenset({1, 2, 3, 4, EXPORT_SCHEMA_VERSION})
"""Export schema versions this toolkit reads and appends runs to (newer ones are refused)."""

MANIFEST_NAME = "manifest.json"
"""The manifest's file name inside an export folder."""

MANIFEST_FORMAT = "runifold-history"
"""The ``format`` field of every manifest."""

EXPORT_COLUMNS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "tasks": (
        ("id", "BIGINT"),
        ("tenant", "VARCHAR"),
        ("definition_name", "VARCHAR"),
        ("definition_version", "INTEGER"),
        ("definition_digest", "VARCHAR"),
        ("state", "VARCHAR"),
        ("wait_reason", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("lease_token", "BIGINT"),
        ("parent_id", "BIGINT"),
        ("idempotency_key", "VARCHAR"),
        ("input", "JSON"),
        ("result", "JSON"),
        ("error", "JSON"),
        ("created_at", "TIMESTAMPTZ"),
        ("run_at", "TIMESTAMPTZ"),
        ("updated_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
        ("schedule_name", "VARCHAR"),
        ("scheduled_at", "TIMESTAMPTZ"),
        ("tags", "JSON"),
        ("parent_occurrence", "VARCHAR"),
        ("map_index", "INTEGER"),
    ),
    "events": (
        ("id", "BIGINT"),
        ("task_id", "BIGINT"),
        ("kind", "VARCHAR"),
        ("worker_id", "VARCHAR"),
        ("fencing_token", "BIGINT"),
        ("detail", "JSON"),
        ("at", "TIMESTAMPTZ"),
    ),
    "effects": (
        ("id", "BIGINT"),
        ("task_id", "BIGINT"),
        ("occurrence", "VARCHAR"),
        ("step", "VARCHAR"),
        ("handler", "VARCHAR"),
        ("idempotent", "BOOLEAN"),
        ("idempotency_key", "VARCHAR"),
        ("record", "VARCHAR"),
        ("attempt", "INTEGER"),
        ("fencing_token", "BIGINT"),
        ("worker_id", "VARCHAR"),
        ("result", "JSON"),
        ("error", "JSON"),
        ("spend", "JSON"),
        ("recorded_at", "TIMESTAMPTZ"),
    ),
    "checkpoints": (
        ("task_id", "BIGINT"),
        ("lease_token", "BIGINT"),
        ("definition_digest", "VARCHAR"),
        ("state", "VARCHAR"),
        ("cursor", "VARCHAR"),
        ("pending", "VARCHAR"),
        ("wait", "JSON"),
        ("checkpoint", "JSON"),
        ("updated_at", "TIMESTAMPTZ"),
    ),
    "schedules": (
        ("name", "VARCHAR"),
        ("definition_name", "VARCHAR"),
        ("owner", "VARCHAR"),
        ("tenant", "VARCHAR"),
        ("cadence", "JSON"),
        ("overlap", "VARCHAR"),
        ("catchup", "VARCHAR"),
        ("paused", "BOOLEAN"),
        ("fired", "BIGINT"),
        ("skipped", "BIGINT"),
        ("missed", "BIGINT"),
        ("caught_up", "BIGINT"),
        ("next_tick", "TIMESTAMPTZ"),
        ("last_tick", "TIMESTAMPTZ"),
        ("created_at", "TIMESTAMPTZ"),
        ("exported_at", "TIMESTAMPTZ"),
    ),
    "emitted": (
        ("id", "BIGINT"),
        ("tenant", "VARCHAR"),
        ("name", "VARCHAR"),
        ("key", "VARCHAR"),
        ("payload", "JSON"),
        ("emitted_at", "TIMESTAMPTZ"),
        ("started", "JSON"),
        ("delivered", "JSON"),
        ("cancelled", "JSON"),
    ),
    "stream": (
        ("task_id", "BIGINT"),
        ("seq", "INTEGER"),
        ("occurrence", "VARCHAR"),
        ("fencing_token", "BIGINT"),
        ("value", "JSON"),
        ("published_at", "TIMESTAMPTZ"),
    ),
}
"""The export schema: table name to its ``(column, DuckDB type)`` pairs, in file order.

Times are UTC ``TIMESTAMPTZ``; ``JSON`` columns hold JSON text (Parquet strings with the
JSON logical type). Version `EXPORT_SCHEMA_VERSION`; docs/history.md describes each column.
"""

TABLES = tuple(EXPORT_COLUMNS)
"""The exported tables, in export order."""

_QUERIES = {
    "tasks": "export_tasks",
    "events": "export_events",
    "effects": "export_effects",
    "checkpoints": "export_checkpoints",
    "schedules": "export_schedules",
    "emitted": "export_emitted",
    "stream": "export_stream",
}

SNAPSHOT_TABLES = frozenset({"schedules"})
"""Tables each run exports whole, as of its snapshot, rather than the rows of its window."""

RUN_FILE = "{table}/run-{number:05d}.parquet"
"""A run's file of a table, relative to the folder (`toolkit.history.analytics` reads the
run number back from the name)."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclasses.dataclass(frozen=True)
class ExportRun:
    """One export run, as the manifest records it.

    Attributes:
        number: 1 for the first run into the folder, then 2, 3 ...
        since: the window's start (rows stamped at or after it), None for "from the start".
        until: the window's end (rows stamped before it), database time.
        exported_at: when the run's snapshot was taken, database time.
        rows: rows written, by table.
        files: the run's Parquet file of each table, relative to the folder.
        oldest: the creation time of the oldest task in the store at export time.
        schema_version: the export schema its files follow (1 for a run whose manifest
            entry does not say: version 1 did not record it).
    """

    number: int
    since: datetime.datetime | None
    until: datetime.datetime
    exported_at: datetime.datetime
    rows: dict[str, int]
    files: dict[str, str]
    oldest: datetime.datetime | None = None
    schema_version: int = EXPORT_SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The run as stored in the manifest (times in ISO 8601 with their offset)."""
        return {
            "number": self.number,
            "since": None if self.since is None else self.since.isoformat(),
            "until": self.until.isoformat(),
            "exported_at": self.exported_at.isoformat(),
            "rows": dict(self.rows),
            "files": dict(self.files),
            "oldest": None if self.oldest is None else self.oldest.isoformat(),
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportRun:
        """Read a run from its manifest entry."""

        def moment(value: Any) -> datetime.datetime | None:
            return None if value is None else datetime.datetime.fromisoformat(value)

        until = moment(data["until"])
        exported_at = moment(data["exported_at"])
        assert until is not None and exported_at is not None
        return cls(
            number=int(data["number"]),
            since=moment(data.get("since")),
            until=until,
            exported_at=exported_at,
            rows={str(k): int(v) for k, v in data["rows"].items()},
            files={str(k): str(v) for k, v in data["files"].items()},
            oldest=moment(data.get("oldest")),
            schema_version=int(data.get("schema_version", 1)),
        )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The contents of an export folder's ``manifest.json``.

    Attributes:
        schema_version: the export schema of the folder's newest runs (older runs may follow
            an older one: see each run's ``schema_version``).
        runs: the export runs, oldest first.
    """

    schema_version: int
    runs: tuple[ExportRun, ...]

    @property
    def rows(self) -> dict[str, int]:
        """Rows written over all runs, by table (a row exported twice counts twice)."""
        return {table: sum(run.rows.get(table, 0) for run in self.runs) for table in TABLES}

    @property
    def time_range(self) -> tuple[datetime.datetime | None, datetime.datetime | None]:
        """``(start, end)`` of the exported time (see `covered`).

        Start None means "from the start"; ``(None, None)`` without runs.
        """
        if not self.runs:
            return None, None
        return self.covered[0], self.covered[1]

    @property
    def covered(self) -> tuple[datetime.datetime | None, datetime.datetime | None]:
        """The longest contiguous window the runs cover from the earliest one.

        ``(start, end)``, start None for "from the start"; ``(None, None)`` without runs.

        A task whose whole history lies in it is exported (what ``toolkit prune`` checks).
        """
        if not self.runs:
            return None, None
        ordered = sorted(self.runs, key=lambda run: run.since or _EPOCH)
        start = ordered[0].since
        end = ordered[0].until
        for run in ordered[1:]:
            if (run.since or _EPOCH) <= end:
                end = max(end, run.until)
        return start, end

    def files(self, table: str) -> list[str]:
        """Paths of a table's Parquet files, relative to the folder, oldest run first."""
        return [run.files[table] for run in self.runs if table in run.files]

    def to_json(self) -> dict[str, Any]:
        """The manifest as stored: format, schema version, pinned columns, runs, totals."""
        start, end = self.time_range
        return {
            "format": MANIFEST_FORMAT,
            "schema_version": self.schema_version,
            "tables": {
                table: [list(pair) for pair in cols] for table, cols in EXPORT_COLUMNS.items()
            },
            "time_range": {
                "since": None if start is None else start.isoformat(),
                "until": None if end is None else end.isoformat(),
            },
            "rows": self.rows,
            "runs": [run.to_json() for run in self.runs],
        }


def read_manifest(out_dir: str | os.PathLike[str]) -> Manifest:
    """Read an export folder's manifest.

    Args:
        out_dir: the export folder.

    Returns:
        The manifest.

    Raises:
        HistoryError: there is no manifest, it cannot be read, or it was written for an
            export schema version this toolkit does not read (a newer one).
    """
    path = Path(out_dir) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HistoryError(f"{out_dir}: no {MANIFEST_NAME}; run `toolkit export` first") from None
    except (OSError, ValueError) as exc:
        raise HistoryError(f"{path}: cannot read the manifest: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise HistoryError(f"{path}: not a runifold history manifest")
    version = data.get("schema_version")
    if not isinstance(version, int) or version not in READABLE_SCHEMA_VERSIONS:
        raise HistoryError(
            f"{path}: export schema version {version}, this toolkit reads versions "
            f"{min(READABLE_SCHEMA_VERSIONS)} to {EXPORT_SCHEMA_VERSION}: read it with the "
            "toolkit that wrote it, or export into a new folder"
        )
    try:
        runs = tuple(ExportRun.from_json(run) for run in data["runs"])
    except (KeyError, TypeError, ValueError) as exc:
        raise HistoryError(f"{path}: malformed run entry: {exc}") from exc
    return Manifest(schema_version=version, runs=runs)


def _write_manifest(out_dir: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically (write a temporary file, then rename it)."""
    text = json.dumps(manifest.to_json(), indent=2) + "\n"
    fd, temp = tempfile.mkstemp(prefix=".manifest-", suffix=".json", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temp, out_dir / MANIFEST_NAME)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _as_utc(moment: datetime.datetime) -> datetime.datetime:
    """An aware time in UTC; a naive one is taken as UTC."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    return moment.astimezone(datetime.UTC)


_READ_CSV = (
    "SELECT * FROM read_csv($path, columns = $columns, header = false, auto_detect = false, "
    "delim = ',', quote = '\"', escape = '\"', allow_quoted_nulls = false)"
)


def _csv_to_parquet(csv_path: Path, table: str, parquet_path: Path) -> int:
    """Convert one table's CSV (PostgreSQL's COPY output) to Parquet with the pinned types.

    Returns:
        The number of rows written.
    """
    columns = dict(EXPORT_COLUMNS[table])
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        relation = con.sql(_READ_CSV, params={"path": str(csv_path), "columns": columns})
        assert relation is not None
        temp = parquet_path.with_name(f".{parquet_path.name}.tmp")
        relation.write_parquet(str(temp), compression="zstd")
        os.replace(temp, parquet_path)
        counted = con.sql(
            "SELECT count(*) FROM read_parquet($path)", params={"path": str(parquet_path)}
        )
        assert counted is not None
        return int(counted.fetchall()[0][0])
    finally:
        con.close()


async def export_history(
    db: Database,
    out_dir: str | os.PathLike[str],
    *,
    since: datetime.datetime | None = None,
) -> ExportRun:
    """Export tasks, events, effect evidence and checkpoints changed since ``since``.

    Creates ``out_dir`` when missing. Each call is one run: a Parquet file per table (even
    an empty one) and a new manifest entry; files of earlier runs are kept as they are. The
    run also writes a snapshot of every schedule (``schedules``: its counters as of the
    run). Only reads the store (one READ ONLY snapshot), so it never blocks a worker.

    A folder of an older readable export schema takes the run too: the run's files follow
    `EXPORT_SCHEMA_VERSION`, the manifest records each run's version and takes the new one.

    Args:
        db: the store's database (``store.db``).
        out_dir: the export folder.
        since: export rows stamped at or after this time (an aware datetime; a naive one is
            taken as UTC). Default: the previous run's ``until``, or everything when the
            folder has no run yet.

    Returns:
        The run, as recorded in the manifest.

    Raises:
        HistoryError: ``out_dir`` holds a manifest of a newer export schema, or is not a
            folder that can be written.
        DatabaseUnavailable: the database cannot be reached.
    """
    folder = Path(out_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HistoryError(f"{folder}: cannot create the export folder: {exc}") from exc
    manifest = (
        read_manifest(folder)
        if (folder / MANIFEST_NAME).exists()
        else Manifest(schema_version=EXPORT_SCHEMA_VERSION, runs=())
    )
    if since is None and manifest.runs:
        since = manifest.runs[-1].until
    number = max((run.number for run in manifest.runs), default=0) + 1
    window_start = _EPOCH if since is None else _as_utc(since)

    rows: dict[str, int] = {}
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix=".export-", dir=folder) as scratch:
        async with db.connection() as conn, conn.transaction():
            await conn.execute(query("export_begin"))
            cursor = await conn.execute(query("export_horizon"))
            horizon = await cursor.fetchone()
            assert horizon is not None
            until, exported_at, oldest = horizon
            await conn.execute(query("export_utc"))
            window = {"since": window_start, "until": until}
            for table in TABLES:
                csv_path = Path(scratch) / f"{table}.csv"
                params = None if table in SNAPSHOT_TABLES else window
                with csv_path.open("wb") as stream:
                    async with conn.cursor().copy(query(_QUERIES[table]), params) as copy:
                        async for chunk in copy:
                            stream.write(chunk)
        for table in TABLES:
            relative = RUN_FILE.format(table=table, number=number)
            target = folder / relative
            target.parent.mkdir(exist_ok=True)
            rows[table] = _csv_to_parquet(Path(scratch) / f"{table}.csv", table, target)
            files[table] = relative
    run = ExportRun(
        number=number,
        since=None if since is None else _as_utc(since),
        until=_as_utc(until),
        exported_at=_as_utc(exported_at),
        rows=rows,
        files=files,
        oldest=None if oldest is None else _as_utc(oldest),
    )
    _write_manifest(
        folder,
        Manifest(schema_version=EXPORT_SCHEMA_VERSION, runs=(*manifest.runs, run)),
    )
    return run
