"""A Citus cluster for the tests that run on one (issue 25), when ``TOOLKIT_TEST_CITUS_DSN``
names its coordinator's database: one with ``CREATE EXTENSION citus`` run and its workers
added (``citus_add_node``). CI machines have no Citus: those tests are skipped, saying so.

A cluster's databases cannot be made from a template as the other tests' are (each needs the
extension and its nodes), so each test empties the one database instead: it drops the
toolkit's tables and functions, migrates and distributes again.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from bench.citus import TOOLKIT_TABLES, drop_toolkit_objects
from toolkit.store.database import Database
from toolkit.store.distribution import distribute

#: The coordinator's database, or None.
CITUS_DSN = os.environ.get("TOOLKIT_TEST_CITUS_DSN")

needs_citus = pytest.mark.skipif(
    CITUS_DSN is None,
    reason="no Citus cluster: set TOOLKIT_TEST_CITUS_DSN to a coordinator's database"
    " with the citus extension and its workers (docs/scaling.md)",
)

def on_citus(config: pytest.Config) -> bool:
    """Whether this session runs its stores on the Citus cluster (``--citus``)."""
    if not config.getoption("citus"):
        return False
    if CITUS_DSN is None:
        raise pytest.UsageError("--citus needs TOOLKIT_TEST_CITUS_DSN (tests/helpers/citus.py)")
    return True


def skip_kept_triggers(config: pytest.Config, kept: bool) -> None:
    """Skip a test of the previous release's triggers (``kept``) on the cluster, whose
    distribution dropped them."""
    if kept and on_citus(config):
        pytest.skip("the distribution drops the triggers (--citus)")


#: The cluster databases this process laid out (a test then only empties their rows).
_LAID_OUT: list[str] = []


def empty_cluster(dsn: str) -> None:
    """Drop every toolkit table and function of the cluster's database (on every node), and
    the tests' own table."""
    if dsn in _LAID_OUT:
        _LAID_OUT.remove(dsn)
    drop_toolkit_objects(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS test_calls")  # the tests' handlers' (counting)
        _drop_tests_own(conn)


#: The tables and functions a test made for itself (``test_...``), but ``test_calls``.
TESTS_OWN = """
SELECT 'TABLE ' || quote_ident(tablename) FROM pg_tables
WHERE schemaname = 'public' AND tablename LIKE 'test\\_%' AND tablename <> 'test_calls'
UNION ALL
SELECT 'FUNCTION ' || p.oid::regprocedure FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.proname LIKE 'test\\_%'
"""


def emptied_rows(dsn: str) -> None:
    """Every toolkit table's rows deleted (but the schema's version and the fleet counts' one
    row, as the migrations left them), identities restarted, and the tests' own table; the
    tables and functions another test made for itself dropped, as a fresh database has none."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            str(table)
            for (table,) in conn.execute(TOOLKIT_TABLES).fetchall()
            if str(table) not in ("toolkit_schema_version", "toolkit_fleet_counts")
        ]
        conn.execute(f"TRUNCATE {', '.join(tables)}, test_calls RESTART IDENTITY")
        conn.execute("DELETE FROM toolkit_fleet_counts")
        conn.execute("INSERT INTO toolkit_fleet_counts DEFAULT VALUES")
        _drop_tests_own(conn)


def _drop_tests_own(conn: psycopg.Connection[Any]) -> None:
    for (made,) in conn.execute(TESTS_OWN).fetchall():
        conn.execute(f"DROP {made} CASCADE")


async def distributed_database(dsn: str, prepare: Callable[[str], Awaitable[None]]) -> None:
    """The cluster's database as a fresh test database: the first time in a process emptied,
    prepared (``prepare``: migrated, with the tests' tables) and distributed (``toolkit db
    migrate --distribute``, a few seconds), then only its rows emptied."""
    if dsn in _LAID_OUT:
        emptied_rows(dsn)
        return
    empty_cluster(dsn)
    await prepare(dsn)
    db = await Database.connect(dsn)
    try:
        await distribute(db)
    finally:
        await db.close()
    _LAID_OUT.append(dsn)


def shards_of_tenants(dsn: str, tenants: list[str]) -> dict[str, str]:
    """The node (``host:port``) holding each tenant's tasks."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            tenant: str(
                conn.execute(
                    "SELECT nodename || ':' || nodeport FROM citus_shards WHERE shardid ="
                    " get_shard_id_for_distribution_column('toolkit_tasks', %s::text)",
                    (tenant,),
                ).fetchone()[0]  # type: ignore[index]
            )
            for tenant in tenants
        }
