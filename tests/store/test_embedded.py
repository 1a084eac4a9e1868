"""The embedded server: started, stopped and started again within one process."""

from __future__ import annotations

from pathlib import Path

import psycopg

from toolkit.store.embedded import start_embedded, stop_embedded


def test_restart_in_the_same_process_starts_a_fresh_server(tmp_path: Path) -> None:
    """Regression: the library's cached handle made a second start return a dead server."""
    home = tmp_path / "home"
    try:
        psycopg.connect(start_embedded(home)).close()
        assert stop_embedded(home)
        assert not stop_embedded(home)  # not running any more
        with psycopg.connect(start_embedded(home)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        stop_embedded(home)
