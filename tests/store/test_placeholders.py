"""psycopg's placeholders converted once per statement text (toolkit/store/placeholders.py).

The store's connections send statements with PostgreSQL's own placeholders, so that psycopg
does not parse a long statement's text on every execution (issue 22). The conversion must
give what psycopg's own gives, for every stored statement, and refuse what it refuses.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg._queries import _query2pg_nocache

from toolkit.store import Store
from toolkit.store.placeholders import Converted, bind, convert
from toolkit.store.queries import query, query_names


@pytest.mark.parametrize("name", sorted(query_names()))
def test_every_stored_statement_converts_as_psycopg_converts_it(name: str) -> None:
    text = query(name)
    theirs, formats, order, _ = _query2pg_nocache(text.encode(), "utf-8")
    ours = convert(text)
    assert ours.text == theirs.decode()
    assert (ours.names or None) == (tuple(order) if order else None)
    assert ours.count == len(formats)


def test_named_placeholders_bind_each_name_once_in_order_of_first_use() -> None:
    converted = convert("SELECT %(b)s, %(a)s, %(b)s WHERE x %% 2 = 0 AND y LIKE 'a%%'")
    text = "SELECT $1, $2, $1 WHERE x % 2 = 0 AND y LIKE 'a%'"
    assert converted == Converted(text, ("b", "a"), 2)
    assert bind("SELECT %(b)s, %(a)s, %(b)s", {"a": 1, "b": 2, "c": 3}) == (
        "SELECT $1, $2, $1",
        [2, 1],
    )


def test_positional_placeholders_take_a_sequence_of_their_number() -> None:
    assert bind("SELECT %s, %s", (1, "x")) == ("SELECT $1, $2", [1, "x"])
    assert bind("SELECT 1", {}) == ("SELECT 1", [])
    assert bind("SELECT 1", []) == ("SELECT 1", [])
    with pytest.raises(psycopg.ProgrammingError, match="1 placeholders but 2 parameters"):
        bind("SELECT %s", (1, 2))


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("SELECT %d", "'%d'"),
        ("SELECT % 2", "'% '"),
        ("SELECT %(a", "'%('"),
        ("SELECT %(a)b", "'%(a)b'"),
        ("SELECT %s, %(a)s", "cannot be mixed"),
        ("SELECT %(a)s, %s", "cannot be mixed"),
    ],
)
def test_what_psycopg_refuses_is_refused(text: str, refused: str) -> None:
    with pytest.raises(psycopg.ProgrammingError, match=re.escape(refused)):
        convert(text)


def test_parameters_that_do_not_suit_the_placeholders_are_refused() -> None:
    with pytest.raises(psycopg.ProgrammingError, match="query parameter missing: a"):
        bind("SELECT %(a)s", {"b": 1})
    with pytest.raises(TypeError, match="named placeholders require a mapping"):
        bind("SELECT %(a)s", [1])
    with pytest.raises(TypeError, match="positional placeholders"):
        bind("SELECT %s", {"a": 1})
    with pytest.raises(TypeError, match="a sequence or a mapping"):
        bind("SELECT %s", "a")


@pytest.mark.anyio
async def test_a_statement_longer_than_psycopgs_cache_is_converted_once(store: Store) -> None:
    # psycopg caches its own conversion only up to 4 KiB of text: this one is longer
    padding = "\n".join(f"-- line {n} of a long comment" for n in range(200))
    text = f"{padding}\nSELECT %(a)s::int + %(b)s::int AS total, '100%%' AS share"
    assert len(text) > 4096
    before = convert.cache_info()
    async with store.db.connection() as conn:
        for n in range(3):
            cursor = await conn.execute(text, {"a": n, "b": 1})
            assert await cursor.fetchone() == (n + 1, "100%")
        cursor = await conn.execute("SELECT '5 %% 2' AS kept")  # no parameters: sent as it is
        assert await cursor.fetchone() == ("5 %% 2",)
    after = convert.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)
