"""Where the store is, and the one helper that opens it and runs a command's coroutine.

A command parses its options, hands :func:`run_in_store` a coroutine function of the open
:class:`~toolkit.store.Store`, and prints what it returns. Errors pass through unchanged:
the ``toolkit`` group turns a :class:`~toolkit.errors.ToolkitError` into one line on
stderr and exit status 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, TypeVar

import anyio
import click
import psycopg
from psycopg.conninfo import conninfo_to_dict

from toolkit.errors import ConfigError
from toolkit.payload import DEFAULT_MAX_BYTES
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.embedded import HOME_NAME, find_home, is_initialised, start_embedded

T = TypeVar("T")


EventLoop = Literal["uvloop", "asyncio"]
"""The event loop a command runs on (``--event-loop``): uvloop's, on libuv, or asyncio's
own. Both are asyncio's API; uvloop's costs a worker less CPU per task (docs/decisions.md)."""


def default_event_loop() -> EventLoop:
    """The default loop: uvloop where it is installed, else asyncio's own.

    uvloop is a dependency on Linux and macOS (``pyproject.toml``).
    """
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


HomeOrigin = Literal["--home", "TOOLKIT_HOME", "found", "default"]
"""How the embedded server's folder was chosen: named by the option or the environment
variable, found as the nearest ``.toolkit`` (in the current folder or a parent), or the
default ``./.toolkit`` when there was none."""


def choose_home(
    given: Path | None, cwd: Path, *, from_environment: bool = False
) -> tuple[Path, HomeOrigin]:
    """The embedded server's folder, and how it was chosen.

    Args:
        given: the ``--home`` / ``TOOLKIT_HOME`` value, None when neither was given.
        cwd: the folder to look for the nearest ``.toolkit`` from.
        from_environment: ``given`` came from ``TOOLKIT_HOME``, not from ``--home``.
    """
    if given is not None:
        return given, "TOOLKIT_HOME" if from_environment else "--home"
    found = find_home(cwd)
    return (found, "found") if found is not None else (Path(HOME_NAME), "default")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where the store is: ``--dsn``/``TOOLKIT_DSN``, else the embedded server in ``home``.

    Attributes:
        dsn: the connection string, None for the embedded server.
        home: the embedded server's folder (``--home``, else the nearest ``.toolkit``).
        max_payload_bytes: the size limit of one stored JSON value (``--max-payload-bytes``).
        home_origin: how ``home`` was chosen (what the note of a new server says).
        event_loop: the event loop the command runs on (``--event-loop``).
    """

    dsn: str | None
    home: Path
    max_payload_bytes: int = DEFAULT_MAX_BYTES
    home_origin: HomeOrigin = "--home"
    event_loop: EventLoop = dataclasses.field(default_factory=default_event_loop)

    @property
    def embedded(self) -> bool:
        """True when no DSN was given."""
        return self.dsn is None

    def resolve_dsn(self) -> str:
        """The DSN to connect to, starting the embedded server when needed.

        A new embedded server is announced on stderr, with its folder: a command run from
        the wrong folder must not quietly show an empty store.
        """
        if self.dsn is not None:
            return self.dsn
        note = self.new_server_note()
        if note is not None:
            click.echo(note, err=True)
        return start_embedded(self.home)

    def new_server_note(self) -> str | None:
        """What to say when the embedded server is created now; None when it exists.

        The reason given is true to how ``home`` was chosen (``home_origin``).
        """
        if self.dsn is not None or is_initialised(self.home):
            return None
        return (
            f"note: creating a new embedded PostgreSQL in {self.home.resolve()} "
            f"({self._why_new()}); the first start takes a few seconds"
        )

    def _why_new(self) -> str:
        """Why the server is new here, true to how ``home`` was chosen."""
        if self.home_origin in ("--home", "TOOLKIT_HOME"):
            return f"{self.home_origin} names this folder, which has no server yet"
        other = "--home or TOOLKIT_HOME names another"
        if self.home_origin == "default":
            return f"no {HOME_NAME} folder in this folder or its parents; {other}"
        above = next(
            (
                folder / HOME_NAME
                for folder in self.home.resolve().parent.parents
                if is_initialised(folder / HOME_NAME)
            ),
            None,
        )
        unused = "" if above is None else f", so the server in {above} further up is not used"
        return f"the nearest {HOME_NAME} folder has no server yet{unused}; {other}"

    def describe(self) -> str:
        """Where the store is, for people: the embedded server's folder, or host/database.

        A DSN is shown as its host, port and database, never its password.
        """
        if self.dsn is None:
            return f"the embedded PostgreSQL in {self.home.resolve()}"
        try:
            params = conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError:
            return "the server of --dsn"
        host = params.get("host") or "localhost"
        port = f":{params['port']}" if params.get("port") else ""
        return f"PostgreSQL at {host}{port}/{params.get('dbname') or params.get('user') or ''}"

    async def open_store(self, *, pool_size: int = 4) -> Store:
        """Open the store; migrate automatically only on the embedded server."""
        store = await Store.open(
            self.resolve_dsn(), pool_size=pool_size, migrate_schema=self.embedded
        )
        store.db.payload_limits = dataclasses.replace(
            store.db.payload_limits, max_bytes=self.max_payload_bytes
        )
        return store


def run_async(command: Callable[[], Awaitable[T]], event_loop: EventLoop | None = None) -> T:
    """Run ``command`` in a fresh event loop and return its result.

    Args:
        command: a coroutine function without arguments.
        event_loop: which loop (see :data:`EventLoop`); None for :func:`default_event_loop`.

    Returns:
        What ``command`` returned; what it raised propagates.

    Raises:
        ConfigError: ``event_loop`` is ``uvloop`` and uvloop is not installed.
    """
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if (event_loop or default_event_loop()) == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            raise ConfigError(
                "--event-loop uvloop (TOOLKIT_EVENT_LOOP): uvloop is not installed here; "
                "install it (pip install uvloop) or choose asyncio"
            ) from exc
        factory = uvloop.new_event_loop
    return anyio.run(command, backend="asyncio", backend_options={"loop_factory": factory})


def run_in_store(
    settings: Settings, command: Callable[[Store], Awaitable[T]], *, pool_size: int = 4
) -> T:
    """Open the store, await ``command(store)``, close the store, and return the result.

    The store opens as :meth:`Settings.open_store` opens it: the embedded server started
    and migrated when no DSN was given, the schema checked otherwise. It is closed
    whether ``command`` returns or raises.

    Args:
        settings: where the store is.
        command: the command's coroutine function, given the open store.
        pool_size: database connections at most.

    Returns:
        What ``command`` returned; what it raised propagates.
    """

    async def session() -> T:
        async with await settings.open_store(pool_size=pool_size) as store:
            return await command(store)

    return run_async(session, settings.event_loop)


def run_in_database(settings: Settings, command: Callable[[Database], Awaitable[T]]) -> T:
    """Connect to the database without touching the schema, await ``command(database)``.

    For the schema commands (``toolkit db``): opening the store would migrate the
    embedded server or refuse an outdated schema before they could look at it.

    Args:
        settings: where the database is.
        command: the command's coroutine function, given the connected database.

    Returns:
        What ``command`` returned; what it raised propagates. The connections are closed
        either way.
    """

    async def session() -> T:
        database = await Database.connect(settings.resolve_dsn())
        try:
            return await command(database)
        finally:
            await database.close()

    return run_async(session, settings.event_loop)
