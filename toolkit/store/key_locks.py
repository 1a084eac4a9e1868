"""The first statement of a keyed insert: the concurrency keys' locks (migration 0031).

A task with a concurrency key is admitted or parked by the statement that inserts it (the
``key_admission`` fragment, ``sql/queries/keys.sql``; docs/flow-control.md), not by a
trigger, since a distributed table can have none (issue 25, docs/scaling.md). That
statement counts the key's live holders, which is sound only in a snapshot taken after the
key's advisory lock was granted (a holder admitted by a transaction that released the lock
in between is then counted). A statement's snapshot is taken before its own locks, so a
keyed insert is two statements in one transaction: ``lock_keys``, then the insert with the
keys it holds. An insert without keys stays one statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row

from toolkit.store.database import Database
from toolkit.store.queries import query

#: A concurrency key: (tenant, definition name, key value).
KeyOf = tuple[str, str, str]


def no_locked_keys() -> dict[str, list[str]]:
    """The parameters of an insert that holds no key's lock (its rows carry none)."""
    return {"locked_tenants": [], "locked_names": [], "locked_keys": []}


async def lock_keys(
    conn: psycopg.AsyncConnection[Any], keys: Sequence[KeyOf]
) -> dict[str, list[str]]:
    """Try the advisory locks of ``keys`` in the connection's transaction, never waiting.

    At most 32 keys per transaction are tried so (``lock_keys``); a key whose lock is not
    taken leaves its rows parked for the admission.

    Args:
        conn: a connection inside the transaction that then runs the insert.
        keys: the keys of the rows to insert, in their order (repeats allowed).

    Returns:
        The insert's parameters ``locked_tenants``, ``locked_names``, ``locked_keys``: the
        keys the transaction holds.
    """
    locked = no_locked_keys()
    if not keys:
        return locked
    cursor = await conn.execute(
        query("lock_keys"),
        {
            "tenants": [key[0] for key in keys],
            "names": [key[1] for key in keys],
            "keys": [key[2] for key in keys],
        },
    )
    for tenant, name, key in await cursor.fetchall():
        locked["locked_tenants"].append(tenant)
        locked["locked_names"].append(name)
        locked["locked_keys"].append(key)
    return locked


async def insert_keyed(
    db: Database, name: str, params: Mapping[str, Any], keys: Sequence[KeyOf]
) -> list[DictRow]:
    """Run insert ``name`` (one that includes ``key_admission``) of rows with keys ``keys``.

    With keys, ``lock_keys`` runs first, in the same transaction; without, the insert runs
    alone.

    Returns:
        The statement's rows.

    Raises:
        DatabaseUnavailable: the database cannot be reached (nothing written).
    """
    if not keys:
        return await db.fetch_all(name, {**params, **no_locked_keys()})
    async with db.transaction() as conn:
        cursor = conn.cursor(row_factory=dict_row)
        locked = await lock_keys(conn, keys)
        await cursor.execute(query(name), {**params, **locked})
        return await cursor.fetchall()
