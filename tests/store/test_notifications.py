"""Notifications sent as statements of their own (NotifyingCursor; issue 25, fourth step).

A statement asks for a notification with a ``notify_<channel>`` result column; the pooled
connection's cursor sends it on the same connection, so that on a distributed store it runs
on the coordinator, where workers listen (docs/scaling.md).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.helpers.inprocess import deploy_submit, sql
from tests.helpers.workflows import THREE_STEPS
from toolkit.errors import StoreError
from toolkit.store import Store
from toolkit.store.queries import query, query_names

pytestmark = pytest.mark.anyio

#: The one statement that is nothing but a notification (ctx.progress: never stored).
OWN_STATEMENT = {"report_progress"}


async def _heard(dsn: str, channel: str) -> psycopg.AsyncConnection[Any]:
    listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await listener.execute(f"LISTEN {channel}")
    return listener


async def _notices(listener: psycopg.AsyncConnection[Any]) -> list[str]:
    """What the listener has been sent by now (its server sends at commit, before the
    sender's statement returns)."""
    return [n.payload async for n in listener.notifies(timeout=0.5)]


def test_no_stored_statement_calls_pg_notify() -> None:
    calling = [
        name
        for name in query_names()
        if re.search(r"\bpg_notify\s*\(", query(name)) and name not in OWN_STATEMENT
    ]
    assert calling == []


async def test_a_submit_wakes_idle_workers(store: Store, dsn: str) -> None:
    listener = await _heard(dsn, "toolkit_wakeup")
    try:
        await deploy_submit(store, THREE_STEPS, [{"n": 1}, {"n": 2}], tenant="acme")
        assert await _notices(listener) == [""]  # two tasks, one wake-up
    finally:
        await listener.close()


async def test_a_notification_waits_for_the_commit_and_a_rollback_sends_none(
    store: Store, dsn: str
) -> None:
    listener = await _heard(dsn, "toolkit_probe")
    statement = "SELECT v AS notify_toolkit_probe FROM unnest(%s::text[]) AS v"
    try:
        async with store.db.transaction() as conn:
            await conn.execute(statement, (["a", "b", "a", None],))
            assert await _notices(listener) == []  # not before the commit
        assert sorted(await _notices(listener)) == ["a", "b"]  # distinct, nulls skipped
        with pytest.raises(RuntimeError):
            async with store.db.transaction() as conn:
                await conn.execute(statement, (["c"],))
                raise RuntimeError("rolled back")
        async with store.db.connection() as conn:
            await conn.execute(statement, ([None],))
        assert await _notices(listener) == []
    finally:
        await listener.close()


async def test_an_array_column_sends_each_element(store: Store, dsn: str) -> None:
    listener = await _heard(dsn, "toolkit_probe")
    try:
        async with store.db.connection() as conn:
            await conn.execute(
                "SELECT ARRAY['a,b', 'c', NULL] AS notify_toolkit_probe"
                " UNION ALL SELECT ARRAY['c']::text[] UNION ALL SELECT NULL"
            )
        assert sorted(await _notices(listener)) == ["a,b", "c"]
    finally:
        await listener.close()


async def test_a_notification_that_fails_after_a_commit_does_not_fail_the_statement(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The statement committed; raising would tell its caller it did not (a caller that
    submits again would submit twice). Inside a transaction the failure is the
    transaction's, which then commits nothing."""
    too_long = "x" * 9000  # pg_notify refuses a payload of 8000 bytes or more
    statement = (
        "INSERT INTO toolkit_tenants (tenant) VALUES (%s) RETURNING %s::text AS notify_probe"
    )
    async with store.db.connection() as conn:
        cursor = await conn.execute(statement, ("committed", too_long))
        assert await cursor.fetchall() == [(too_long,)]
    assert "notification_lost" in [getattr(r, "action", None) for r in caplog.records]
    with pytest.raises(StoreError, match="payload string too long"):
        async with store.db.transaction() as conn:
            await conn.execute(statement, ("rolled_back", too_long))
    names = await sql(store, "SELECT tenant FROM toolkit_tenants ORDER BY tenant")
    assert names == [("committed",)]


async def test_a_column_without_the_prefix_sends_nothing(store: Store, dsn: str) -> None:
    """Not vacuous: the same values under another name are a result, not a notification."""
    listener = await _heard(dsn, "toolkit_probe")
    try:
        async with store.db.connection() as conn:
            await conn.execute("SELECT 'a'::text AS toolkit_probe")
        assert await _notices(listener) == []
    finally:
        await listener.close()
