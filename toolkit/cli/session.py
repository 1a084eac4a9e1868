"""Where the store is, and the one helper that opens it and runs a command's coroutine.

A command parses its options, hands :func:`run_in_store` a coroutine function of the open
:class:`~toolkit.store.Store`, and prints what it returns. Errors pass through unchanged:
the ``toolkit`` group turns a :class:`~toolkit.errors.ToolkitError` into one line on
stderr and exit status 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import click
import psycopg
from psycopg.conninfo import conninfo_to_dict

from toolkit.payload import DEFAULT_MAX_BYTES
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.embedded import is_initialised, start_embedded

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where the store is: ``--dsn``/``TOOLKIT_DSN``, else the embedded server in ``home``.

    Attributes:
        dsn: the connection string, None for the embedded server.
        home: the embedded server's folder (``--home``, else the nearest ``.toolkit``).
        max_payload_bytes: the size limit of one stored JSON value (``--max-payload-bytes``).
    """

    dsn: str | None
    home: Path
    max_payload_bytes: int = DEFAULT_MAX_BYTES

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
        if not is_initialised(self.home):
            click.echo(
                f"note: creating a new embedded PostgreSQL in {self.home.resolve()} (none in "
                "this folder or its parents; --home or TOOLKIT_HOME names another); "
                "the first start takes a few seconds",
                err=True,
            )
        return start_embedded(self.home)

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


def run_async(command: Callable[[], Awaitable[T]]) -> T:
    """Run ``command`` in a fresh event loop (asyncio) and return its result.

    Args:
        command: a coroutine function without arguments.

    Returns:
        What ``command`` returned; what it raised propagates.
    """
    return anyio.run(command, backend="asyncio")


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

    return run_async(session)


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

    return run_async(session)
