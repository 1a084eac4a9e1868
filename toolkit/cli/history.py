"""Task history after the fact: ``export`` to Parquet, ``stats`` from it, ``prune`` the store.

The history modules (DuckDB, Parquet) are imported by the commands that use them, so
that every other command starts without them.
"""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.options import duration_option, since_option
from toolkit.cli.session import Settings, run_in_store
from toolkit.counts import counted


@click.command("export")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--since",
    metavar="TIMESTAMP",
    help="Export rows stamped at or after this ISO 8601 time (UTC without an offset). "
    "Default: where the folder's last export ended, or everything.",
)
@click.pass_obj
def export_cmd(settings: Settings, out_dir: Path, since: str | None) -> None:
    """Export task, event, effect evidence and checkpoint history to Parquet in OUT_DIR.

    Each run adds one file per table, a snapshot of the schedules and a manifest entry;
    earlier files stay.
    """
    from toolkit.history.export import export_history

    start = since_option(since)
    run = run_in_store(settings, lambda store: export_history(store.db, out_dir, since=start))
    window = "the start" if run.since is None else f"{run.since:%Y-%m-%d %H:%M:%S}"
    click.echo(
        f"exported run {run.number} to {out_dir}: rows from {window} "
        f"to {run.until:%Y-%m-%d %H:%M:%S} UTC"
    )
    for table, count in run.rows.items():
        click.echo(f"  {table:<12} {count:>8}")


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--bucket", default="1h", show_default=True, help="Time bucket of the per-time tables."
)
def stats(out_dir: Path, bucket: str) -> None:
    """Print history statistics from the export in OUT_DIR (no database needed).

    Queue delay, step execution time, lease losses, retries, failures, time waiting,
    budget spend, throughput and schedules (tick lag, skipped and missed ticks), as
    tables.
    """
    from toolkit import history

    width = duration_option(bucket, "--bucket")
    with history.open(out_dir) as h:
        click.echo(h.report(width), nl=False)


@click.command()
@click.option(
    "--older-than",
    required=True,
    metavar="DURATION",
    help="Age of a terminal task since it finished, e.g. 30d or 12h.",
)
@click.option(
    "--exported-to",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Export folder that must hold each task's whole history.",
)
@click.option("--force", is_flag=True, help="Delete old terminal tasks even if not exported.")
@click.option("--batch-size", default=500, show_default=True, help="Tasks per delete statement.")
@click.option("--event-retention", default="7d", show_default=True, metavar="DURATION",
              help="Age past which the events emitted are deleted (once exported).")  # fmt: skip
@click.pass_obj
def prune(
    settings: Settings,
    older_than: str,
    exported_to: Path | None,
    force: bool,
    batch_size: int,
    event_retention: str,
) -> None:
    """Delete terminal tasks and their history once exported, in small batches.

    Refuses (deleting nothing) while an old terminal task is not in the export, unless
    --force.
    """
    from toolkit.history.retention import prune as prune_tasks

    seconds = duration_option(older_than, "--older-than")
    retention = duration_option(event_retention, "--event-retention")
    report = run_in_store(
        settings,
        lambda store: prune_tasks(
            store.db,
            older_than=seconds,
            exported_to=exported_to,
            force=force,
            batch_size=batch_size,
            event_retention=retention,
        ),
    )
    click.echo(
        f"pruned {counted(report.tasks, 'task')} ({counted(report.events, 'event')}, "
        f"{counted(report.evidence, 'evidence record')}, {counted(report.signals, 'signal')}) "
        f"in {counted(report.batches, 'batch', 'batches')}"
        + (f"; {counted(report.emitted, 'event')} emitted" if report.emitted else "")
        + (f"; {counted(report.throttle_keys, 'idle throttle key')}" if report.throttle_keys
           else "")
    )
