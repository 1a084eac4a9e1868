"""A scratch database of one notebook session, cleaned up however the session ends.

:class:`ScratchDatabase` gives a tutorial its own empty PostgreSQL database. It is removed by
:meth:`ScratchDatabase.stop`, at interpreter exit, and — because a kernel can also be killed
or shut down without its last cell — by a watchdog process that outlives the session by a
moment: it holds the read end of a pipe whose write end only the session holds, and cleans up
when that pipe closes, whatever closed it (issue 24: kernels leaked servers).

Run as ``python -m toolkit.history.scratch JSON`` only by :class:`ScratchDatabase`.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from toolkit.store.embedded import start_embedded, stop_embedded


class ScratchDatabase:
    """A PostgreSQL database of one notebook session, removed by :meth:`stop` or at exit.

    With ``TOOLKIT_TEST_DSN`` set, a fresh database is created on that server; otherwise
    the embedded server is started in a new temporary folder. Either way the database is
    empty: task ids start at 1. The database (or the server and its folder) is removed by
    :meth:`stop`, at interpreter exit, or by a watchdog process when the session's process
    dies without either (SIGKILL, a kernel shut down from JupyterLab).

    Attributes:
        dsn: the database's DSN once :meth:`start` returned, else "".
    """

    def __init__(self) -> None:
        self.dsn = ""
        self._cleanup: dict[str, str] = {}
        self._watchdog: IO[bytes] | None = None

    def start(self) -> str:
        """Create (or start) the database, and the watchdog that removes it.

        Returns:
            Its DSN.

        Raises:
            DatabaseUnavailable: the embedded server could not be started.
        """
        server = os.environ.get("TOOLKIT_TEST_DSN")
        if server:
            name = f"toolkit_nb_{uuid.uuid4().hex[:12]}"
            # The name is an identifier: composed by psycopg.sql, never by string formatting.
            create = sql.SQL("CREATE DATABASE {}")
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(create.format(sql.Identifier(name)))
            params = conninfo_to_dict(server)
            params["dbname"] = name
            self._cleanup = {"server": server, "name": name}
            self.dsn = make_conninfo("", **params)
        else:
            home = tempfile.mkdtemp(prefix="toolkit-notebook-")
            self._cleanup = {"home": home}
            self.dsn = start_embedded(home)
        self._watchdog = _start_watchdog(self._cleanup)
        atexit.register(self.stop)
        return self.dsn

    def stop(self) -> None:
        """Drop the database (or stop the embedded server and delete its folder).

        Idempotent; the watchdog ends with it.
        """
        cleanup, self._cleanup = self._cleanup, {}
        if cleanup:
            remove(cleanup)
        if self._watchdog is not None:
            self._watchdog.close()  # the watchdog wakes, finds nothing left, and exits
            self._watchdog = None
        atexit.unregister(self.stop)
        self.dsn = ""


def remove(cleanup: dict[str, str]) -> None:
    """Remove what ``cleanup`` names: ``{"server", "name"}`` a database, ``{"home"}`` a server.

    Idempotent: what is already gone is skipped.
    """
    if "name" in cleanup:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        with psycopg.connect(cleanup["server"], autocommit=True) as conn:
            conn.execute(drop.format(sql.Identifier(cleanup["name"])))
    if "home" in cleanup:
        stop_embedded(cleanup["home"])
        shutil.rmtree(cleanup["home"], ignore_errors=True)


def _start_watchdog(cleanup: dict[str, str]) -> IO[bytes]:
    """Start the watchdog process; returns the pipe end whose closing sets it off."""
    process = subprocess.Popen(
        [sys.executable, "-m", __name__, json.dumps(cleanup)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a kernel's process group may be signalled as a whole
    )
    assert process.stdin is not None
    return process.stdin


def _watch(argument: str) -> None:
    """Wait until the session's end of the pipe closes, then remove what it names."""
    cleanup: dict[str, Any] = json.loads(argument)
    sys.stdin.buffer.read()  # returns at end of file: the session has stopped or died
    remove(cleanup)


if __name__ == "__main__":
    _watch(sys.argv[1])
