"""Notifications as statements of their own, asked for by a statement's result.

A statement that should wake idle workers, or tell a task's readers something, does not call
``pg_notify`` itself: it returns a column named ``notify_<channel>`` (for example
``notify_toolkit_wakeup``) whose non-null values (text, or arrays of text) are the
payloads to send. The cursor
of every pooled connection (:class:`NotifyingCursor`) then sends them with one
``pg_notify`` statement on the same connection: in the same transaction when one is open
(delivered at its commit, as before), else right after the autocommitted statement.

Why (issue 25; docs/scaling.md, "Wake-ups on the coordinator"): on a distributed store
(Citus) a ``pg_notify`` inside a statement routed to one shard runs on the worker node
that holds the shard, so a ``LISTEN`` on the coordinator never hears it, and ``pg_notify``
in the ``RETURNING`` of a modification is refused there. A statement of its own runs on
the coordinator. The notification is a hint either way: a worker polls with backoff when
none comes, so one lost between an autocommitted statement and its notification (a crash
in between) delays work, never loses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, LiteralString, Self, overload

import psycopg
from psycopg import AsyncCursor, AsyncRawCursor, pq
from psycopg.abc import Params, Query, QueryNoTemplate
from psycopg.sql import Composable

from toolkit.store.placeholders import bind

if TYPE_CHECKING:
    from psycopg._compat import Template  # string.templatelib's, where Python has it

logger = logging.getLogger(__name__)

#: The prefix of a result column whose values are notifications to send.
NOTIFY_PREFIX = b"notify_"

_SEND: LiteralString = "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload"


class NotifyingCursor(AsyncRawCursor[Any]):
    """A cursor that sends the notifications its statement's result asks for.

    Statements are written with psycopg's placeholders (``%(name)s``, ``%s``) and sent with
    PostgreSQL's, converted once per statement text (`toolkit.store.placeholders`): a raw
    cursor, so that psycopg does not parse the store's long statements on every execution.

    After each ``execute``, every result column named ``notify_<channel>`` has its distinct
    non-null values (or those of its arrays) sent on ``<channel>`` (text payloads, at most
    8000 bytes each, as ``pg_notify`` allows), in one statement on the same connection.
    The result itself is left for the caller to fetch.
    """

    @overload
    async def execute(
        self,
        query: QueryNoTemplate,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self: ...

    @overload
    async def execute(
        self, query: Template, *, prepare: bool | None = None, binary: bool | None = None
    ) -> Self: ...

    async def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        """Run the statement (as ``AsyncCursor.execute``), then send its notifications.

        Raises:
            psycopg.Error: the statement or its notifications failed.
            TypeError: ``params`` do not suit the statement's placeholders (see `bind`).
        """
        sent: Query = query  # without parameters: sent as it is, ``%`` included, as psycopg does
        if params is not None:
            if isinstance(query, Composable):
                query = query.as_string(self)
            if not isinstance(query, str):
                raise TypeError(f"a statement with parameters must be text, got {query!r}")
            sent, params = bind(query, params)
        await super().execute(sent, params, prepare=prepare, binary=binary)  # type: ignore[arg-type]
        # most statements ask for none: their text says so, without reading the result
        if not isinstance(query, str) or "notify_" in query:
            await send_notifications(self)
        return self

    async def executemany(
        self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
    ) -> None:
        """Run the statement once per set of parameters, pipelined in one round trip.

        As ``AsyncCursor.executemany``, but it sends no notifications: a statement that asks
        for some is refused.

        Raises:
            psycopg.Error: a statement failed.
            TypeError: the statement is not text, asks for notifications, or ``params_seq``
                does not suit its placeholders (see `bind`).
        """
        if not isinstance(query, str) or "notify_" in query:
            raise TypeError(f"executemany takes text that asks for no notification: {query!r}")
        bound = [bind(query, params) for params in params_seq]
        if bound:
            await super().executemany(
                bound[0][0], [params for _, params in bound], returning=returning
            )


async def send_notifications(cursor: AsyncCursor[Any]) -> None:
    """Send what the cursor's current result asks for (see the module's docstring).

    Raises:
        psycopg.Error: the notification statement failed inside a transaction (after an
            autocommitted statement, a failure is logged instead: see ``_send``).
    """
    result = cursor.pgresult
    if result is None or not result.ntuples:
        return
    for column in range(result.nfields):
        name = result.fname(column)
        if not name or not name.startswith(NOTIFY_PREFIX):
            continue
        # the same value on every row is common (a statement-wide notice): load it once
        values = (result.get_value(row, column) for row in range(result.ntuples))
        distinct = {value for value in values if value is not None}
        if not distinct:
            continue
        if result.fformat(column) != pq.Format.TEXT:
            raise ValueError(f"notification column {name!r} must be read as text")
        oid = result.ftype(column)
        load = cursor.adapters.get_loader(oid, pq.Format.TEXT)
        if load is None:
            raise ValueError(f"notification column {name!r} has a type no loader reads")
        loader = load(oid, cursor)
        sent: set[str] = set()
        for raw in distinct:
            value = loader.load(raw)
            if isinstance(value, list):
                sent.update(str(item) for item in value if item is not None)
            elif value is not None:
                sent.add(str(value))
        if sent:
            channel = name[len(NOTIFY_PREFIX) :].decode()
            await _send(cursor, channel, sorted(sent))


async def _send(cursor: AsyncCursor[Any], channel: str, payloads: list[str]) -> None:
    """Send on the cursor's connection.

    Inside a transaction a failure is the transaction's. After an autocommitted statement it
    is only logged: that statement has committed, and raising would tell its caller it
    failed (a caller that submits again would submit twice); a lost notification costs a
    worker's poll interval.
    """
    conn = cursor.connection
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        await conn.execute(_SEND, (channel, payloads))
        return
    try:
        await conn.execute(_SEND, (channel, payloads))
    except psycopg.Error as exc:
        logger.warning(
            "notification on %s not sent after its statement committed: %s",
            channel, exc, extra={"action": "notification_lost", "channel": channel},
        )  # fmt: skip
