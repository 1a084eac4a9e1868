"""The wheel ships what a non-editable install needs: the schema, the SQL, the examples."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_contains_schema_sql_and_examples(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("runifold-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "toolkit/schemas/workflow.schema.json" in names
    assert "toolkit/store/sql/migrations/0001_initial.sql" in names
    assert "toolkit/history/sql/analytics.sql" in names
    assert {
        f"toolkit/store/sql/queries/{n}.sql" for n in ("tasks", "leases", "definitions", "workers")
    } <= names
    assert any(n.startswith("toolkit/examples/") and n.endswith(".sql") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "toolkit = toolkit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
