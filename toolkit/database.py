"""The one seam between the toolkit and the PostgreSQL driver.

A :class:`Database` owns a psycopg connection pool, runs named queries from the ``sql/``
folder and turns driver errors into the toolkit's own (STYLE.md: driver errors are wrapped
``from exc`` in one seam, classified by SQLSTATE class, never by message text).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row

from toolkit.errors import DatabaseUnavailable, StoreError
from toolkit.queries import query

logger = logging.getLogger(__name__)

#: SQLSTATE classes that mean "the database went away or cannot be reached".
_UNAVAILABLE_CLASSES = ("08", "57", "53")

Params = Mapping[str, Any]


def redact_dsn(dsn: str) -> str:
    """Return the DSN with any password removed, safe for logs and messages.

    Args:
        dsn: a libpq connection string or URI.

    Returns:
        A ``key=value`` connection string without ``password``; the input unchanged when it
        cannot be parsed (it then cannot be shown to hold a password either).
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    params.pop("password", None)
    return make_conninfo("", **{key: value for key, value in params.items() if value is not None})


def is_unavailable(exc: BaseException) -> bool:
    """Tell whether a driver error means the database cannot be reached right now.

    Args:
        exc: any exception.

    Returns:
        True for connection failures, server shutdowns and resource exhaustion (SQLSTATE
        classes 08, 57, 53), pool timeouts and closed connections.
    """
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        sqlstate = exc.sqlstate
        return sqlstate is None or sqlstate[:2] in _UNAVAILABLE_CLASSES
    return False


@contextlib.contextmanager
def translated_errors(dsn: str) -> Iterator[None]:
    """Translate driver errors raised inside the block into toolkit errors.

    Args:
        dsn: the connection string, shown without its password in messages.

    Raises:
        DatabaseUnavailable: the database cannot be reached (see :func:`is_unavailable`).
        StoreError: any other database error, with its SQLSTATE.
    """
    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        if is_unavailable(exc):
            raise DatabaseUnavailable(
                f"cannot reach PostgreSQL at {redact_dsn(dsn)}: {_first_line(exc)}"
            ) from exc
        sqlstate = getattr(exc, "sqlstate", None)
        raise StoreError(f"database error {sqlstate or ''}: {_first_line(exc)}".strip()) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Database:
    """A pool of autocommit connections and the named queries run on them.

    Every statement runs in autocommit mode, so a single statement is a single
    transaction; :meth:`transaction` groups several.
    """

    def __init__(self, pool: psycopg_pool.AsyncConnectionPool[Any], dsn: str) -> None:
        self._pool = pool
        self.dsn = dsn

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 10.0,
    ) -> Database:
        """Open a pool and check that the database answers.

        Args:
            dsn: libpq connection string or URI.
            min_size: connections kept open.
            max_size: connections at most.
            timeout: seconds to wait for the first connection.

        Returns:
            An open :class:`Database`; close it with :meth:`close`.

        Raises:
            DatabaseUnavailable: the server cannot be reached within ``timeout``.
        """

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.set_autocommit(True)

        # One direct connection first: an unreachable server fails fast with libpq's reason,
        # not after the pool's retries with "pool initialization incomplete".
        with translated_errors(dsn):
            probe = await psycopg.AsyncConnection.connect(
                dsn, connect_timeout=max(1, round(timeout)), application_name="runifold"
            )
            await probe.close()
        pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            open=False,
            configure=configure,
            kwargs={"application_name": "runifold"},
            timeout=timeout,
            name="runifold",
        )
        try:
            with translated_errors(dsn):
                await pool.open(wait=True, timeout=timeout)
        except DatabaseUnavailable:
            await pool.close()
            raise
        return cls(pool, dsn)

    def pool_stats(self) -> dict[str, int]:
        """The pool's statistics (sizes, waiting requests, wait time in ms), cumulative."""
        return self._pool.get_stats()

    async def close(self) -> None:
        """Close every connection of the pool."""
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Borrow an autocommit connection.

        Raises:
            DatabaseUnavailable: no connection could be had.
            StoreError: another database error inside the block.
        """
        with translated_errors(self.dsn):
            async with self._pool.connection() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Borrow a connection inside one transaction, committed when the block ends."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def fetch_all(self, name: str, params: Params | None = None) -> list[DictRow]:
        """Run a named query and return every row as a dict.

        Args:
            name: the query's block name in ``sql/queries``.
            params: its named parameters.
        """
        async with self.connection() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(query(name), params or {})
            return await cursor.fetchall()

    async def fetch_one(self, name: str, params: Params | None = None) -> DictRow | None:
        """Run a named query and return its first row, or None."""
        rows = await self.fetch_all(name, params)
        return rows[0] if rows else None

    async def execute(self, name: str, params: Params | None = None) -> int:
        """Run a named statement and return the number of rows it affected."""
        async with self.connection() as conn:
            cursor = await conn.execute(query(name), params or {})
            return cursor.rowcount
