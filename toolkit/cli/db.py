"""``db``: schema migrations and the embedded server."""

from __future__ import annotations

import functools
import sys

import click

from toolkit.cli.session import Settings, run_in_database
from toolkit.store.distribution import distribute as distribute_tables
from toolkit.store.embedded import stop_embedded
from toolkit.store.migrations import migrate, schema_status


@click.group()
def db() -> None:
    """Schema migrations and the embedded server."""


@db.command("migrate")
@click.option(
    "--distribute",
    is_flag=True,
    help="Then distribute the tables by tenant over the Citus cluster of this coordinator"
    " (once; docs/scaling.md).",
)
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    help="With --distribute: shards per table (default: Citus' citus.shard_count). A few per"
    " worker node: every read across tenants visits each shard.",
)
@click.pass_obj
def db_migrate(settings: Settings, distribute: bool, shards: int | None) -> None:
    """Apply pending schema migrations."""
    if shards is not None and not distribute:
        raise click.UsageError("--shards goes with --distribute")
    applied = [f"{m.version:04d}_{m.name}" for m in run_in_database(settings, migrate)]
    click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")
    if distribute:
        done, layout = run_in_database(
            settings, functools.partial(distribute_tables, shards=shards)
        )
        click.echo("distributed:" if done else "already distributed:")
        for table in layout:
            placed = ", ".join(f"{node} {n}" for node, n in sorted(table.shards.items()))
            click.echo(f"  {table.table:<30} {table.layout:<10} {placed}")


@db.command("status")
@click.pass_obj
def db_status(settings: Settings) -> None:
    """Show the schema version against the one this toolkit needs."""
    status = run_in_database(settings, schema_status)
    click.echo(
        f"schema version {status.current}, expected {status.expected}"
        + (f", pending {list(status.pending)}" if status.pending else "")
    )
    if status.pending:
        sys.exit(1)


@db.command("stop")
@click.pass_obj
def db_stop(settings: Settings) -> None:
    """Stop the embedded server of TOOLKIT_HOME (the nearest .toolkit by default)."""
    stopped = stop_embedded(settings.home)
    where = settings.home.resolve()
    click.echo(
        f"embedded PostgreSQL in {where} stopped"
        if stopped
        else f"embedded PostgreSQL in {where} was not running"
    )
