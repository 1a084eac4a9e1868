"""Test fixtures: a real PostgreSQL, one template database per session, a fresh copy per test.

The embedded server is used unless ``TOOLKIT_TEST_DSN`` names another (CI runs the store and
worker tests a second time against the system PostgreSQL 15 that way). With ``--citus``, the
tests that use a store run on the Citus cluster of ``TOOLKIT_TEST_CITUS_DSN`` instead, its
tables distributed (tests/helpers/citus.py; docs/scaling.md): each test empties the one
database and lays it out again, and the tests that need databases of their own, or the
triggers the distribution drops, are skipped there.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.apps.counting import CREATE_CALLS
from tests.helpers.citus import CITUS_DSN, distributed_database, on_citus, skip_kept_triggers
from tests.helpers.tenants import (
    keys_over_max_active,
    rows_under_another_tenant,
    tasks_missed_by_the_rotation,
)
from tests.helpers.triggers import (
    ENDING_TRIGGERS,
    KEY_TRIGGERS,
    ROTATION_TRIGGERS,
    drop_triggers,
)
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.embedded import start_embedded, stop_embedded
from toolkit.store.migrations import _CREATE_VERSION_TABLE, _RECORD, available_migrations, migrate

DATABASE_FIXTURES = {"dsn", "store", "template_dsn"}


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


#: Tests that start, stop or kill worker processes: run once, on the default server, and
#: not again by ``-m integration`` on a second one (CI's second pass).
PROCESS_TESTS = Path(__file__).resolve().parent / "process"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--citus",
        action="store_true",
        help="run the tests that use a store on the Citus cluster of TOOLKIT_TEST_CITUS_DSN,"
        " distributed by tenant (slow: the database is laid out again for each test)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("one_postgresql") and config.getoption("citus"):
            item.add_marker(pytest.mark.skip(reason="checks one PostgreSQL (--citus)"))
        if PROCESS_TESTS in item.path.parents:
            continue
        if DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A DSN of the server the tests use (its maintenance database).

    The embedded server's data lives outside pytest's rotating temp folders, which another
    pytest session on the same machine may delete while this one runs.
    """
    dsn = os.environ.get("TOOLKIT_TEST_DSN")
    if dsn:
        yield dsn
        return
    home = tempfile.mkdtemp(prefix="toolkit-tests-")
    try:
        yield start_embedded(home)
    finally:
        stop_embedded(home)
        shutil.rmtree(home, ignore_errors=True)


def _admin(dsn: str, statement: sql.Composable) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


async def prepare_database(dsn: str) -> None:
    """Migrate a database and add the tests' call-count table."""
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        async with db.connection() as conn:
            await conn.execute(CREATE_CALLS)
    finally:
        await db.close()


@pytest.fixture(scope="session")
def template_dsn(server_dsn: str, pytestconfig: pytest.Config) -> Iterator[str]:
    """A migrated template database, built once per session."""
    if on_citus(pytestconfig):
        pytest.skip("needs databases of its own: not on the cluster (--citus)")
    name = f"toolkit_template_{os.getpid()}"
    _admin(server_dsn, sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
    _admin(server_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_dbname(server_dsn, name)
    anyio.run(prepare_database, dsn)
    yield dsn
    _admin(
        server_dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture
def dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh migrated database for one test (``--citus``: the cluster's, distributed)."""
    if on_citus(request.config):
        assert CITUS_DSN is not None
        anyio.run(distributed_database, CITUS_DSN, prepare_database)
        yield CITUS_DSN
        return
    server_dsn = request.getfixturevalue("server_dsn")
    template = conninfo_to_dict(request.getfixturevalue("template_dsn"))["dbname"]
    name = f"toolkit_test_{uuid.uuid4().hex[:12]}"
    _admin(
        server_dsn,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(str(template))
        ),
    )
    yield with_dbname(server_dsn, name)
    _admin(
        server_dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


def at_schema_version(dsn: str, version: int) -> None:
    """Bring an empty database to schema ``version`` the way that release left it, to test
    the migrations that follow on rows written before them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_CREATE_VERSION_TABLE)
        for migration in available_migrations()[:version]:
            conn.execute(migration.sql)  # type: ignore[arg-type]
            conn.execute(_RECORD, (migration.version, migration.name))


@pytest.fixture
def empty_dsn(server_dsn: str, pytestconfig: pytest.Config) -> Iterator[str]:
    """A fresh database without the schema, for migration tests."""
    if on_citus(pytestconfig):
        pytest.skip("needs a database of its own: not on the cluster (--citus)")
    name = f"toolkit_empty_{uuid.uuid4().hex[:12]}"
    _admin(server_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield with_dbname(server_dsn, name)
    _admin(
        server_dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[Store]:
    """An open store on a fresh database."""
    opened = await Store.open(dsn, migrate_schema=False)
    try:
        yield opened
        misplaced = await rows_under_another_tenant(opened)
        assert not misplaced, f"rows stored under another tenant than their task's: {misplaced}"
        missed = await tasks_missed_by_the_rotation(opened)
        assert not missed, f"live tasks due before their tenant rejoins the rotation: {missed}"
        crowded = await keys_over_max_active(opened)
        assert not crowded, f"concurrency keys held by more tasks than max_active: {crowded}"
    finally:
        await opened.close()


@pytest.fixture(params=["triggers kept", "triggers dropped"])
async def ending(request: pytest.FixtureRequest, store: Store) -> Store:
    """The store as migrated, and without the four end triggers, as a distributed store will
    be (tests/helpers/triggers.py)."""
    skip_kept_triggers(request.config, request.param == "triggers kept")
    if request.param == "triggers dropped" and not on_citus(request.config):
        await drop_triggers(store, ENDING_TRIGGERS)
    return store


@pytest.fixture(params=["triggers kept", "triggers dropped"])
async def marking(request: pytest.FixtureRequest, store: Store) -> Store:
    """The store as migrated, and without the tenant rotation's four triggers."""
    skip_kept_triggers(request.config, request.param == "triggers kept")
    if request.param == "triggers dropped" and not on_citus(request.config):
        await drop_triggers(store, ROTATION_TRIGGERS)
    return store


@pytest.fixture(params=["triggers kept", "triggers dropped"])
async def keying(request: pytest.FixtureRequest, store: Store) -> Store:
    """The store as migrated, and without the two triggers that admitted keyed tasks."""
    skip_kept_triggers(request.config, request.param == "triggers kept")
    if request.param == "triggers dropped" and not on_citus(request.config):
        await drop_triggers(store, KEY_TRIGGERS)
    return store


@dataclasses.dataclass
class PrivateServer:
    """An embedded PostgreSQL of one test, which the test may stop and start again."""

    home: str
    dsn: str = ""

    def start(self) -> str:
        self.dsn = start_embedded(self.home)
        return self.dsn

    def stop(self) -> None:
        stop_embedded(self.home)


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """A migrated embedded server of this test alone (for restarts), in a temp home."""
    server = PrivateServer(tempfile.mkdtemp(prefix="toolkit-private-"))
    try:
        server.start()
        anyio.run(prepare_database, server.dsn)
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.home, ignore_errors=True)
