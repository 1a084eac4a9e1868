"""Retention (``toolkit prune``): only exported history is deleted, in batches, unless forced."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers.history import deploy, run_until_idle, submit_and_run, with_store
from tests.helpers.workflows import DEFINITIONS, WAITER
from toolkit.cli import cli
from toolkit.errors import NotExported
from toolkit.history.export import export_history
from toolkit.history.retention import prune
from toolkit.store import Store
from toolkit.store.queries import query

pytestmark = pytest.mark.anyio


async def task_count(store: Store) -> int:
    return sum((await store.tasks.counts_by_state()).values())


async def backdate(store: Store, seconds: int) -> None:
    async with store.db.connection() as conn:
        await conn.execute(
            # toolkit_seconds_after: Citus takes no stable function of a column in an UPDATE
            "UPDATE toolkit_tasks SET finished_at = toolkit_seconds_after(finished_at, -%s) "
            "WHERE finished_at IS NOT NULL",
            (float(seconds),),
        )


async def test_prune_refuses_unexported_tasks(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    await submit_and_run(store)
    await backdate(store, 7200)
    with pytest.raises(NotExported, match="4 terminal tasks older than 1h are not exported"):
        await prune(store.db, older_than=3600, exported_to=tmp_path / "none")
    await export_history(store.db, tmp_path)
    await submit_and_run(store, flows=2, broken=0)  # finished after the export
    await backdate(store, 7200)
    with pytest.raises(NotExported, match="2 terminal tasks"):
        await prune(store.db, older_than=3600, exported_to=tmp_path)
    assert await task_count(store) == 6  # refused whole: nothing deleted


async def test_prune_deletes_exported_tasks_in_batches(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    await submit_and_run(store, flows=5)
    [waiting] = await store.tasks.submit(WAITER, [{}], tenant="acme")
    await run_until_idle(store, DEFINITIONS)
    await backdate(store, 7200)
    await export_history(store.db, tmp_path)

    report = await prune(store.db, older_than=3600, exported_to=tmp_path, batch_size=2)
    # batches of two ids: (1, 2) and (3, 4) of acme, (5, 6) of acme and globex, one delete
    # per tenant of a batch (a store distributed by tenant routes each to its shard)
    assert report.tasks == 6 and report.batches == 4 and report.refused == 0
    assert report.events > 0 and report.evidence > 0
    assert [t.id for t in await store.tasks.list()] == [waiting]  # live tasks stay
    async with store.db.connection() as conn:
        row = await (await conn.execute("SELECT count(*) FROM toolkit_task_events")).fetchone()
    assert row is not None and row[0] == len(await store.tasks.events(waiting))

    # Younger than the limit: kept.
    await store.tasks.signal(waiting, "go")
    await run_until_idle(store, DEFINITIONS)
    again = await prune(store.db, older_than=3600, exported_to=tmp_path)
    assert again.tasks == 0 and await task_count(store) == 1


async def test_prune_force_deletes_without_export(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    await submit_and_run(store)
    await backdate(store, 7200)
    report = await prune(store.db, older_than=3600, force=True)
    assert report.tasks == 4 and await task_count(store) == 0


async def test_prune_deletes_every_row_of_a_task(store: Store) -> None:
    """No foreign key cascades a task's delete (migration 0037; a store distributed by
    tenant never had them): the prune statement deletes the rows of every table that has a
    task id itself."""
    async with store.db.connection() as conn:
        per_task = [row[0] for row in await (await conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
            " WHERE c.relkind = 'r' AND c.relname LIKE 'toolkit%' AND a.attname = 'task_id'"
            " AND NOT a.attisdropped AND c.relname <> 'toolkit_bulk_plan_tasks' ORDER BY 1"
        )).fetchall()]  # fmt: skip
        cursor = await conn.execute(
            "SELECT count(*) FROM pg_constraint"
            " WHERE contype = 'f' AND confrelid = 'toolkit_tasks'::regclass"
        )
        assert await cursor.fetchone() == (0,)
    assert len(per_task) == 8, per_task
    statement = query("prune_tasks")
    assert [t for t in per_task if f"DELETE FROM {t}\n" not in statement] == []

    await deploy(store)
    await submit_and_run(store)
    await backdate(store, 7200)
    report = await prune(store.db, older_than=3600, force=True)
    assert report.tasks == 4 and report.events > 0 and report.evidence > 0
    async with store.db.connection() as conn:
        for table in per_task:
            cursor = await conn.execute(f"SELECT count(*) FROM {table}")
            assert await cursor.fetchone() == (0,), table


def test_cli_prune(dsn: str, tmp_path: Path) -> None:
    async def setup(store: Store) -> None:
        await deploy(store)
        await submit_and_run(store)
        await backdate(store, 7200)

    with_store(dsn, setup)
    runner = CliRunner()
    result = runner.invoke(cli, ["--dsn", dsn, "prune", "--older-than", "1h"])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and "--exported-to" in result.output
    out = tmp_path / "hist"
    # a folder that is not there is named as such (it was "does not hold their history")
    result = runner.invoke(
        cli, ["--dsn", dsn, "prune", "--older-than", "1h", "--exported-to", str(out)]
    )
    assert result.exit_code == 2 and f"'{out}' does not exist" in result.output, result.output
    assert runner.invoke(cli, ["--dsn", dsn, "export", str(out)]).exit_code == 0
    result = runner.invoke(
        cli, ["--dsn", dsn, "prune", "--older-than", "1h", "--exported-to", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "pruned 4 tasks" in result.output
    result = runner.invoke(cli, ["--dsn", dsn, "prune", "--older-than", "soon", "--force"])
    assert result.exit_code != 0 and "Traceback" not in result.output


async def test_prune_deletes_exported_events_past_their_retention(
    store: Store, tmp_path: Path
) -> None:
    for n in range(3):
        await store.events.emit("order.placed", {"order_id": f"o-{n}"}, key=f"k-{n}")
    async with store.db.connection() as conn:
        await conn.execute(
            "UPDATE toolkit_events SET emitted_at = toolkit_seconds_after(emitted_at, -8 * 86400)"
            " WHERE key <> 'k-2'"
        )
    kept = await prune(store.db, older_than=3600)  # no export, not forced: events stay
    assert kept.emitted == 0 and len(await store.events.list()) == 3
    await export_history(store.db, tmp_path)
    report = await prune(store.db, older_than=3600, exported_to=tmp_path, batch_size=1)
    assert report.emitted == 2 and report.batches == 2, report
    assert [e.key for e in await store.events.list()] == ["k-2"]
    # Its key is free again: a new emit of it is a new event.
    again = await store.events.emit("order.placed", {"order_id": "o-0"}, key="k-0")
    assert not again.duplicate
