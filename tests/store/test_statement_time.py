"""Database time a distributed store's coordinator can give (migration 0028; issue 25).

Citus refuses ``clock_timestamp()`` (VOLATILE) in a statement that modifies a distributed
table. Every query reads ``statement_timestamp()`` instead, and so does every toolkit
function and column default once migrated (docs/scaling.md, docs/decisions.md).
"""

from __future__ import annotations

import re

import pytest

from tests.helpers.inprocess import sql
from toolkit.store import Store
from toolkit.store.queries import query, query_names

pytestmark = pytest.mark.anyio

_CLOCK = re.compile(r"\bclock_timestamp\s*\(", re.IGNORECASE)


def _code(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def test_no_query_reads_the_volatile_clock() -> None:
    reading = [name for name in query_names() if _CLOCK.search(_code(query(name)))]
    assert reading == []


async def test_no_toolkit_function_or_default_reads_the_volatile_clock(store: Store) -> None:
    functions = await sql(
        store,
        "SELECT proname FROM pg_proc WHERE proname LIKE 'toolkit%%'"
        " AND prosrc ~* 'clock_timestamp\\s*\\('",
    )
    defaults = await sql(
        store,
        "SELECT c.relname || '.' || a.attname FROM pg_attrdef ad"
        " JOIN pg_class c ON c.oid = ad.adrelid"
        " JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum"
        " WHERE c.relname LIKE 'toolkit%%'"
        " AND pg_get_expr(ad.adbin, ad.adrelid) LIKE '%%clock_timestamp%%'",
    )
    assert (functions, defaults) == ([], [])
    # Not vacuous: the same probe finds a function that still reads it.
    await sql(
        store,
        "CREATE FUNCTION toolkit_probe_clock() RETURNS timestamptz LANGUAGE sql"
        " AS 'SELECT clock_timestamp()'",
    )
    found = await sql(
        store,
        "SELECT proname FROM pg_proc WHERE proname LIKE 'toolkit%%'"
        " AND prosrc ~* 'clock_timestamp\\s*\\('",
    )
    assert found == [("toolkit_probe_clock",)]


async def test_the_fence_is_stable(store: Store) -> None:
    """Citus refuses a VOLATILE function in an update of a distributed table."""
    rows = await sql(store, "SELECT provolatile FROM pg_proc WHERE proname = 'toolkit_lease_held'")
    assert rows == [("s",)]

