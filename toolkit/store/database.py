"""The one seam between the toolkit and the PostgreSQL driver.

A :class:`Database` owns a psycopg connection pool, runs named queries from the ``sql/``
folder and turns driver errors into the toolkit's own (STYLE.md: driver errors are wrapped
``from exc`` in one seam, classified by SQLSTATE class, never by message text).

Outages: when a statement finds the database unreachable, the pool's idle connections are
checked at once and the broken ones replaced, so an outage (a restart, terminated backends)
costs one failure per caller, not one per stale connection. A second, one-connection pool is
reserved for lease renewals (:meth:`Database.fetch_all` with ``reserved=True``): handlers
that hold every connection of the main pool cannot starve the heartbeat. A third pool plans
each prepared statement once (``plan_once=True``): the worker's claim and group commit,
whose generic plans are checked (docs/decisions.md, "The hot statements are planned once").
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, LiteralString

import anyio
import orjson
import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_loads

from toolkit.errors import DatabaseUnavailable, StoreError
from toolkit.payload import PayloadLimits
from toolkit.store.notifying_cursor import NotifyingCursor
from toolkit.store.queries import query

logger = logging.getLogger(__name__)

#: SQLSTATE classes that mean "the database went away or cannot be reached".
_UNAVAILABLE_CLASSES = ("08", "57", "53")
#: SQLSTATE classes of a transaction the server rolled back (deadlock, serialization).
_ROLLED_BACK_CLASSES = ("40",)

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
        DatabaseUnavailable: the database cannot be reached (see :func:`is_unavailable`), or
            it rolled the transaction back (SQLSTATE class 40: deadlock, serialization
            failure): nothing was written and the call may be tried again.
        StoreError: any other database error, with its SQLSTATE.
    """
    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        if isinstance(exc, psycopg_pool.PoolTimeout):
            raise DatabaseUnavailable(
                f"no free connection to PostgreSQL at {redact_dsn(dsn)}: {first_line(exc)} "
                "(every connection of the pool is in use or the server is unreachable)"
            ) from exc
        if is_unavailable(exc):
            refused = _refusal(exc)
            if refused is not None:  # reached: it refused the connection (no such database)
                raise DatabaseUnavailable(
                    f"PostgreSQL at {redact_dsn(dsn)} refused the connection: {refused}"
                ) from exc
            raise DatabaseUnavailable(
                f"cannot reach PostgreSQL at {redact_dsn(dsn)}: {first_line(exc)}"
            ) from exc
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate is not None and sqlstate[:2] in _ROLLED_BACK_CLASSES:
            # A deadlock or serialization failure: nothing was written, and the same call can
            # succeed later. Treated like an outage, never as a refusal that fails a task.
            raise DatabaseUnavailable(
                f"PostgreSQL rolled the transaction back ({sqlstate}), try again: "
                f"{first_line(exc)}"
            ) from exc
        what = f"database error {sqlstate}" if sqlstate else "database error"
        raise StoreError(f"{what}: {first_line(exc)}") from exc


def _refusal(exc: BaseException) -> str | None:
    """The server's reason when it answered a connection with a FATAL error, else None.

    E.g. a database or a role that does not exist, or a password refused.
    """
    _, fatal, reason = first_line(exc).partition("FATAL:")
    return (reason.strip() or None) if fatal else None


def first_line(exc: BaseException) -> str:
    """The first line of the driver's message for ``exc`` (its type's name if it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_Pool = psycopg_pool.AsyncConnectionPool[Any]
#: The main pool, the reserve and the pool that plans once.
_Pools = tuple[_Pool, _Pool, _Pool]


#: What every pooled connection sets (:func:`_configure`).
SESSION_SETTINGS: tuple[LiteralString, ...] = ("SET jit = off",)
#: What a connection of the pool that plans once sets besides (:func:`_configure_plan_once`).
PLAN_ONCE_SETTINGS: tuple[LiteralString, ...] = (
    "SET plan_cache_mode = force_generic_plan",
    "SET enable_bitmapscan = off",
)


#: Every byte but an ASCII digit made a space, every digit a zero: a number of 19 digits or
#: more then reads as this run (:func:`load_json`).
_DIGITS_AS_ZEROS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_RUN = b"0" * 19


def load_json(text: str | bytes) -> Any:
    """The value of a ``json`` or ``jsonb`` column's text, as the standard library reads it.

    Read by orjson, about three times as fast as ``json.loads`` on a claimed task's input
    and checkpoint (docs/decisions.md, "JSON columns are read by orjson"). orjson reads an
    integer past 64 bits as a float without an error; text with a run of 19 digits or more
    (such an integer, or a long fraction) and text orjson refuses are read by
    ``json.loads``, so every value comes back exactly as before.

    Args:
        text: the column's text (UTF-8 bytes, as psycopg hands it to a loader).

    Returns:
        The decoded value.

    Raises:
        json.JSONDecodeError: the text is not JSON (never, from PostgreSQL's own types).
    """
    data = text.encode() if isinstance(text, str) else text
    if _LONG_RUN not in data.translate(_DIGITS_AS_ZEROS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Configure every pooled connection.

    Autocommit, no JIT compilation (docs/decisions.md), cursors that send the
    notifications a statement's result asks for (:class:`NotifyingCursor`), and JSON
    columns read by :func:`load_json`.
    """
    conn.cursor_factory = NotifyingCursor
    set_json_loads(load_json, conn)
    await conn.set_autocommit(True)
    for setting in SESSION_SETTINGS:
        await conn.execute(setting)


async def _configure_plan_once(conn: psycopg.AsyncConnection[Any]) -> None:
    """Configure a connection of the pool that plans once (generic plans from the start).

    As every pooled connection, and a prepared statement gets its generic plan from its
    first execution on. PostgreSQL plans a prepared statement afresh for its first five
    executions, and then for as long as the generic plan's estimate stays above the custom
    plans' average: the claim's ``LIMIT`` parameter, guessed at a tenth of the due rows when
    unknown, kept it planned at every call, as costly as running it (docs/decisions.md).

    Without bitmap scans: a generic plan of the fair claim, not knowing how many due tasks a
    tenant has, may read each tenant's due tasks off a bitmap of the claim index and sort
    them, every one of them, where an index scan in claim order stops at the batch; with 200
    due tasks per tenant that made the claim three times as slow, and it grows with a
    tenant's backlog. The statements of these connections read by key or in index order.
    """
    await _configure(conn)
    for setting in PLAN_ONCE_SETTINGS:
        await conn.execute(setting)


async def _probe(dsn: str, timeout: float) -> None:
    """Open and close one direct connection.

    Raises:
        DatabaseUnavailable: the server does not answer (libpq's reason, no password).
    """
    with translated_errors(dsn):
        probe = await psycopg.AsyncConnection.connect(
            dsn, connect_timeout=max(1, round(timeout)), application_name="runifold"
        )
        await probe.close()


#: Connections of the pool that plans once: a worker's claim loop and its group commit each
#: have one statement in flight at a time.
PLAN_ONCE_CONNECTIONS = 2


def _pools(dsn: str, min_size: int, max_size: int, timeout: float) -> _Pools:
    """The main pool, the reserve and the pool that plans once, not yet open.

    The reserve has one connection and the pool that plans once
    :data:`PLAN_ONCE_CONNECTIONS`, both made on first use.
    """
    # A connection attempt to a host that does not answer gives up after this long, so
    # the pool's reconnection during an outage never hangs on one attempt.
    kwargs = {"application_name": "runifold", "connect_timeout": max(1, round(timeout))}

    def pool(
        name: str, sizes: tuple[int, int], configure: Callable[[Any], Awaitable[None]]
    ) -> _Pool:
        return psycopg_pool.AsyncConnectionPool(
            dsn, min_size=sizes[0], max_size=sizes[1], open=False, configure=configure,
            kwargs=kwargs, timeout=timeout, name=name,
        )  # fmt: skip

    return (
        pool("runifold", (min_size, max_size), _configure),
        pool("runifold-reserve", (0, 1), _configure),
        pool("runifold-plan-once", (0, PLAN_ONCE_CONNECTIONS), _configure_plan_once),
    )


#: Seconds between two direct probes of a database that was found unreachable.
PROBE_INTERVAL = 0.5


class Database:
    """A pool of autocommit connections and the named queries run on them.

    Every statement runs in autocommit mode, so a single statement is a single
    transaction; :meth:`transaction` groups several.

    After a call finds the database unreachable (a broken connection, a failed connect),
    the next calls that find no idle connection ask the server directly, at most every
    :data:`PROBE_INTERVAL` seconds: while it does not answer they fail at once with
    :class:`~toolkit.errors.DatabaseUnavailable` instead of waiting for the pool's timeout;
    once it answers, both pools are replaced by fresh ones. (A pool reconnects with
    exponential backoff: left alone, it would resume up to the outage's length again after
    the database is back.)

    Attributes:
        dsn: the connection string (never shown: use :func:`redact_dsn`).
        payload_limits: the size and nesting limits of JSON values written through this
            database (task inputs, results, signal payloads); default 1 MiB and 64 levels.
        registered_tenants: the tenants whose rows this process has seen committed
            (``toolkit.store.submission.register_tenant``).
        task_tenants: the tenants of tasks this process looked up by id, by task id
            (``toolkit.store.task_tenants.task_tenant``).
        distributed: whether the toolkit's tables are distributed by tenant (Citus), once
            asked (``toolkit.store.distribution.is_distributed``); None until then.
    """

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Any],
        dsn: str,
        reserve: psycopg_pool.AsyncConnectionPool[Any] | None = None,
        new_pools: Callable[[], _Pools] | None = None,
        plan_once: psycopg_pool.AsyncConnectionPool[Any] | None = None,
    ) -> None:
        self._pool = pool
        self._reserve = reserve
        self._plan_once = plan_once
        self._new_pools = new_pools
        self._checking = False
        self._suspect = False
        self._last_probe = -math.inf
        self._last_probe_error = ""
        self._recovery = anyio.Lock()
        self.dsn = dsn
        self.payload_limits = PayloadLimits()
        self.registered_tenants: set[str] = set()
        self.task_tenants: dict[int, str] = {}
        self.distributed: bool | None = None

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
            timeout: seconds to wait for the first connection, and for a free one later.

        Returns:
            An open :class:`Database`; close it with :meth:`close`.

        Raises:
            DatabaseUnavailable: the server cannot be reached within ``timeout``.
        """
        # One direct connection first: an unreachable server fails fast with libpq's reason,
        # not after the pool's retries with "pool initialization incomplete".
        await _probe(dsn, timeout)

        def new_pools() -> _Pools:
            return _pools(dsn, min_size, max_size, timeout)

        pool, reserve, plan_once = new_pools()
        try:
            with translated_errors(dsn):
                await pool.open(wait=True, timeout=timeout)
                await reserve.open(wait=False)
                await plan_once.open(wait=False)
        except DatabaseUnavailable:
            for each in (pool, reserve, plan_once):
                await each.close()
            raise
        return cls(pool, dsn, reserve, new_pools, plan_once)

    def pool_stats(self) -> dict[str, int]:
        """The pool's statistics (sizes, waiting requests, wait time in ms), cumulative."""
        return self._pool.get_stats()

    async def close(self) -> None:
        """Close every connection of every pool."""
        self._new_pools = None
        for pool in (self._pool, self._reserve, self._plan_once):
            if pool is not None:
                await pool.close()

    @contextlib.asynccontextmanager
    async def connection(
        self, *, reserved: bool = False, plan_once: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Borrow an autocommit connection.

        Args:
            reserved: borrow the reserved connection (lease renewals) instead of one of the
                main pool.
            plan_once: borrow one of the pool that plans each prepared statement once, its
                generic plan (``plan_cache_mode = force_generic_plan``). Only for statements
                whose generic plans are checked (tests/store/test_query_plan.py): a generic
                plan cannot use a parameter's value to choose an index.

        Raises:
            DatabaseUnavailable: no connection could be had, or it broke in the block; the
                pool's idle connections are then checked and broken ones replaced.
            StoreError: another database error inside the block.
        """
        if self._suspect:
            await self._recover()
        pool = (
            self._reserve if reserved and self._reserve is not None
            else self._plan_once if plan_once and self._plan_once is not None
            else self._pool
        )  # fmt: skip
        try:
            with translated_errors(self.dsn):
                async with pool.connection() as conn:
                    yield conn
        except DatabaseUnavailable as exc:
            current = pool in (self._pool, self._reserve, self._plan_once)
            if current and not isinstance(exc.__cause__, psycopg_pool.PoolTimeout):
                self._suspect = True  # a pool merely exhausted is no reason to replace it
            await self._discard_broken(pool)
            raise
        if pool in (self._pool, self._plan_once):
            self._suspect = False

    async def _recover(self) -> None:
        """Probe a database found unreachable; replace the pools once it answers again.

        Raises:
            DatabaseUnavailable: the server did not answer the last probe, made less than
                :data:`PROBE_INTERVAL` seconds ago, or this one.
        """
        if self._new_pools is None or self._pool.get_stats().get("pool_available", 0) > 0:
            return  # an idle connection to try first
        async with self._recovery:
            if not self._suspect or self._new_pools is None:
                return  # recovered meanwhile by another caller
            now = anyio.current_time()
            if now - self._last_probe < PROBE_INTERVAL:
                raise DatabaseUnavailable(self._last_probe_error)
            self._last_probe = now
            try:
                await _probe(self.dsn, min(self._pool.timeout, 5.0))
            except DatabaseUnavailable as exc:
                self._last_probe_error = str(exc)
                raise
            fresh = self._new_pools()
            for pool in fresh:
                await pool.open(wait=False)
            old = [self._pool, self._reserve, self._plan_once]
            self._pool, self._reserve, self._plan_once = fresh
            self._suspect = False
            logger.debug(
                "the database answers again; connection pools replaced",
                extra={"action": "pools_replaced"},
            )
            for stale in old:  # connections still borrowed from them close when returned
                if stale is not None:
                    with anyio.CancelScope(shield=True):
                        await stale.close(timeout=0)

    async def _discard_broken(self, pool: psycopg_pool.AsyncConnectionPool[Any]) -> None:
        """Check the idle connections of ``pool`` once, replacing the broken ones."""
        if self._checking or pool.closed:
            return
        self._checking = True
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await pool.check()
        except Exception as exc:  # a failed check must not hide the caller's error
            logger.debug("pool check failed: %s", exc, extra={"action": "pool_check_failed"})
        finally:
            self._checking = False

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Borrow a connection inside one transaction, committed when the block ends."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def fetch_all(
        self,
        name: str,
        params: Params | None = None,
        *,
        reserved: bool = False,
        prepare: bool | None = None,
        plan_once: bool = False,
    ) -> list[DictRow]:
        """Run a named query and return every row as a dict.

        Args:
            name: the query's block name in ``sql/queries``.
            params: its named parameters.
            reserved: run it on the reserved connection (see :meth:`connection`).
            prepare: False for a statement whose plan must fit each call's values (the
                task filter's optional terms); None lets psycopg prepare it once it has run
                a few times on a connection.
            plan_once: run it on a connection of the pool that plans once (see
                :meth:`connection`).
        """
        async with self.connection(reserved=reserved, plan_once=plan_once) as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(query(name), params or {}, prepare=prepare)
            return await cursor.fetchall()

    async def fetch_all_then(
        self,
        name: str,
        params: Params,
        then: Callable[[list[DictRow]], tuple[str, Params] | None],
    ) -> list[DictRow]:
        """Run a named query, then the statement ``then`` derives from its rows.

        Both run in one transaction; the second sees what the first locked, in a snapshot
        of its own.

        Args:
            name: the first query's block name.
            params: its parameters.
            then: from the first query's rows, the second statement's name and parameters,
                or None for none.

        Returns:
            The first query's rows.
        """
        async with self.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(query(name), params)
            rows = await cursor.fetchall()
            second = then(rows)
            if second is not None:
                await cursor.execute(query(second[0]), second[1])
        return rows

    async def fetch_one(
        self, name: str, params: Params | None = None, *, prepare: bool | None = None
    ) -> DictRow | None:
        """Run a named query and return its first row, or None (``prepare``: as fetch_all)."""
        rows = await self.fetch_all(name, params, prepare=prepare)
        return rows[0] if rows else None

    async def execute(self, name: str, params: Params | None = None) -> int:
        """Run a named statement and return the number of rows it affected."""
        async with self.connection() as conn:
            cursor = await conn.execute(query(name), params or {})
            return cursor.rowcount
