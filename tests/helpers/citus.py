"""A Citus cluster for the tests that run on one (issue 25), when ``TOOLKIT_TEST_CITUS_DSN``
names its coordinator's database: one with ``CREATE EXTENSION citus`` run and its workers
added (``citus_add_node``). CI machines have no Citus: those tests are skipped, saying so.

A cluster's databases cannot be made from a template as the other tests' are (each needs the
extension and its nodes), so each test empties the one database instead: it drops the
toolkit's tables and functions, migrates and distributes again.
"""

from __future__ import annotations

import os

import psycopg
import pytest

#: The coordinator's database, or None.
CITUS_DSN = os.environ.get("TOOLKIT_TEST_CITUS_DSN")

needs_citus = pytest.mark.skipif(
    CITUS_DSN is None,
    reason="no Citus cluster: set TOOLKIT_TEST_CITUS_DSN to a coordinator's database"
    " with the citus extension and its workers (docs/scaling.md)",
)

# The coordinator holds reference tables' shards too (toolkit_definitions_102458): a
# toolkit table's name never ends in digits, a shard's always does.
_TABLES = r"""
SELECT c.oid::regclass FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
  AND c.relname LIKE 'toolkit\_%' AND c.relname !~ '_[0-9]+$'
"""
_FUNCTIONS = r"""
SELECT p.oid::regprocedure FROM pg_proc p
WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'toolkit\_%'
"""


def empty_cluster(dsn: str) -> None:
    """Drop every toolkit table and function of the cluster's database (on every node)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (table,) in conn.execute(_TABLES).fetchall():
            conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        for (function,) in conn.execute(_FUNCTIONS).fetchall():
            conn.execute(f"DROP FUNCTION IF EXISTS {function} CASCADE")


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
