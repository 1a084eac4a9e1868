"""File ingest: hash a CSV file, profile it, aggregate its numeric columns, write a report.

The pure functions (:func:`read_table`, :func:`profile_table`, :func:`aggregate_table`,
:func:`write_report`, ...) do the work; the ``*_handler`` functions at the bottom adapt them
to effect handlers of the ``file-ingest`` definition. Every handler is idempotent: calling it
again with the same arguments gives the same result and leaves the same files behind.

Relative paths are resolved against the current working directory.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolkit.application import EffectContext

_CHUNK = 1 << 16
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class DataError(ValueError):
    """The input file cannot be read as the table it should be; retrying will not help."""


class SourceChanged(DataError):
    """The input file changed between two steps of the same task."""


@dataclasses.dataclass(frozen=True)
class Table:
    """A CSV file read as text cells.

    Attributes:
        columns: the header row.
        rows: the data rows, each as long as ``columns``; empty cells are ``""``.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def cells(self, column: str) -> list[str]:
        """The cells of one column, top to bottom.

        Raises:
            DataError: the table has no such column.
        """
        try:
            index = self.columns.index(column)
        except ValueError:
            raise DataError(f"no column {column!r}; the columns are {list(self.columns)}") from None
        return [row[index] for row in self.rows]


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the SHA-256 of a file's bytes, as 64 hex digits (read in 64 KiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def parse_csv(text: str, *, source: str = "<text>") -> Table:
    """Parse CSV text with a header row.

    Args:
        text: the file's content.
        source: the file name, for error messages.

    Raises:
        DataError: the text is empty, the header has blank or repeated names, or a row has
            a different number of cells than the header.
    """
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        raise DataError(f"{source}: the file is empty (a header row is required)")
    columns = tuple(name.strip() for name in header)
    if any(not name for name in columns) or len(set(columns)) != len(columns):
        raise DataError(f"{source}: the header needs distinct, non-blank names: {list(columns)}")
    rows = []
    for row in reader:
        if not row:
            continue  # a blank line
        if len(row) != len(columns):
            raise DataError(
                f"{source}: line {reader.line_num} has {len(row)} cells, the header {len(columns)}"
            )
        rows.append(tuple(cell.strip() for cell in row))
    return Table(columns, tuple(rows))


def read_table(path: str | os.PathLike[str]) -> Table:
    """Read a UTF-8 CSV file with a header row (see :func:`parse_csv`).

    Raises:
        DataError: the file is not UTF-8 or not a well-formed table.
        OSError: the file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text: {exc}") from exc
    return parse_csv(text, source=str(path))


def to_number(cell: str) -> float | None:
    """Read one cell as a finite number; ``None`` for an empty cell.

    Raises:
        ValueError: the cell is neither empty nor a finite number.
    """
    if cell == "":
        return None
    value = float(cell)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {cell!r}")
    return value


def _is_numeric(cells: Sequence[str]) -> bool:
    seen = False
    for cell in cells:
        try:
            value = to_number(cell)
        except ValueError:
            return False
        seen = seen or value is not None
    return seen


def date_column(table: Table) -> str | None:
    """The first column whose non-empty cells all start with an ISO date, if any."""
    for column in table.columns:
        cells = [cell for cell in table.cells(column) if cell]
        if cells and all(_ISO_DATE.match(cell) for cell in cells):
            return column
    return None


def profile_table(table: Table) -> dict[str, Any]:
    """Describe a table: its size, which columns are numeric, missing cells, date range.

    Returns:
        ``{"columns", "rows", "numeric", "missing", "missing_cells", "date_column",
        "first_date", "last_date"}``; ``missing`` maps each column to its empty cells.
    """
    missing = {column: table.cells(column).count("") for column in table.columns}
    dates = date_column(table)
    dated = sorted(cell for cell in table.cells(dates) if cell) if dates else []
    return {
        "columns": list(table.columns),
        "rows": len(table.rows),
        "numeric": [column for column in table.columns if _is_numeric(table.cells(column))],
        "missing": missing,
        "missing_cells": sum(missing.values()),
        "date_column": dates,
        "first_date": dated[0][:10] if dated else None,
        "last_date": dated[-1][:10] if dated else None,
    }


def summarize(values: Sequence[float | None], *, digits: int = 3) -> dict[str, Any]:
    """Summary statistics of one column, ignoring missing values.

    Args:
        values: the column's numbers, ``None`` where a cell is empty.
        digits: decimal places kept in the results.

    Returns:
        ``count``, ``missing``, ``min``, ``max``, ``mean``, ``median``, ``stdev`` (sample
        standard deviation, ``None`` below two values) and ``sum``; the statistics are
        ``None`` for a column with no values.
    """
    present = [value for value in values if value is not None]
    summary: dict[str, Any] = {"count": len(present), "missing": len(values) - len(present)}
    if not present:
        return summary | dict.fromkeys(("min", "max", "mean", "median", "stdev", "sum"))
    return summary | {
        "min": round(min(present), digits),
        "max": round(max(present), digits),
        "mean": round(statistics.fmean(present), digits),
        "median": round(statistics.median(present), digits),
        "stdev": round(statistics.stdev(present), digits) if len(present) > 1 else None,
        "sum": round(math.fsum(present), digits),
    }


def numbers(table: Table, column: str) -> list[float | None]:
    """The column's cells as numbers (``None`` for empty cells).

    Raises:
        DataError: the column is missing or a cell is not a number.
    """
    try:
        return [to_number(cell) for cell in table.cells(column)]
    except ValueError as exc:
        raise DataError(f"column {column!r}: {exc}") from None


def monthly_means(table: Table, column: str, dates: str, *, digits: int = 3) -> dict[str, Any]:
    """Mean of ``column`` per calendar month (``YYYY-MM``) of the ISO dates in ``dates``.

    Rows with an empty date or value are left out; months are in calendar order.
    """
    groups: dict[str, list[float]] = {}
    for day, value in zip(table.cells(dates), numbers(table, column), strict=True):
        if day and value is not None:
            groups.setdefault(day[:7], []).append(value)
    return {month: round(statistics.fmean(groups[month]), digits) for month in sorted(groups)}


def aggregate_table(table: Table, columns: Sequence[str]) -> dict[str, Any]:
    """Aggregate the named numeric columns: a summary each, and monthly means when dated.

    Args:
        table: the parsed file.
        columns: the columns to aggregate.

    Returns:
        ``{column: {**summarize(...), "by_month": {...}}}`` (``by_month`` only when the
        table has a date column).

    Raises:
        DataError: a column is missing or not numeric.
    """
    dates = date_column(table)
    result: dict[str, Any] = {}
    for column in columns:
        summary = summarize(numbers(table, column))
        if dates is not None and dates != column:
            summary["by_month"] = monthly_means(table, column, dates)
        result[column] = summary
    return result


def report_name(source: str, columns: Sequence[str] | None = None) -> str:
    """The report's file name, derived from the input only (so a retry rewrites the same file).

    ``data/oslo-2024.csv`` → ``oslo-2024.json``; with ``columns=["wind_kmh"]`` →
    ``oslo-2024.wind_kmh.json``.
    """
    parts = [Path(source).stem, *(columns or ())]
    return _UNSAFE_NAME.sub("_", ".".join(parts)) + ".json"


def write_report(report_dir: str | os.PathLike[str], name: str, report: Any) -> dict[str, Any]:
    """Write ``report`` as JSON to ``report_dir/name`` atomically.

    The JSON goes to a temporary file in the same folder, which then replaces the target
    with :func:`os.replace`, so a reader never sees half a report and a repeated call leaves
    one complete file. The folder is created when missing.

    Returns:
        ``{"path": absolute path, "bytes": size, "sha256": digest of the file}``.
    """
    folder = Path(report_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    target = folder / name
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return {"path": str(target), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _checked_table(path: str, sha256: str | None) -> Table:
    """Read ``path``, refusing it if its content no longer has the hash an earlier step saw."""
    table = read_table(path)
    if sha256 is not None and sha256_file(path) != sha256:
        raise SourceChanged(
            f"{path} changed since it was hashed (expected sha256 {sha256[:12]}...)"
        )
    return table


# --- handlers (sync: the worker runs them in a thread) ------------------------------------------


def hash_file_handler(ctx: EffectContext, path: str) -> dict[str, Any]:
    """``files.hash``: the file's absolute path, size in bytes and SHA-256."""
    resolved = Path(path).resolve()
    return {
        "path": str(resolved),
        "bytes": resolved.stat().st_size,
        "sha256": sha256_file(resolved),
    }


def profile_csv_handler(ctx: EffectContext, path: str, sha256: str | None = None) -> dict[str, Any]:
    """``csv.profile``: :func:`profile_table` of the file (checked against ``sha256``)."""
    return profile_table(_checked_table(path, sha256))


def aggregate_csv_handler(
    ctx: EffectContext, path: str, columns: Sequence[str], sha256: str | None = None
) -> dict[str, Any]:
    """``csv.aggregate``: :func:`aggregate_table` of the file (checked against ``sha256``)."""
    return aggregate_table(_checked_table(path, sha256), columns)


def write_report_handler(
    ctx: EffectContext,
    report_dir: str,
    source: str,
    report: Any,
    columns: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``reports.write``: write ``report`` to ``report_dir`` under :func:`report_name`."""
    return write_report(report_dir, report_name(source, columns), report)
