"""The fleet: ``workers`` (live and recently stopped) and ``doctor`` (health checks)."""

from __future__ import annotations

import dataclasses
import sys

import click

from toolkit.cli.output import echo_json
from toolkit.cli.session import Settings, run_async, run_in_store
from toolkit.ops.doctor import diagnose
from toolkit.store import Store


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def workers(settings: Settings, as_json: bool) -> None:
    """Live workers, then those stopped in the last day."""
    records = run_in_store(settings, lambda store: store.workers.list())
    if as_json:
        echo_json([dataclasses.asdict(r) for r in records])
        return
    click.echo(f"{'WORKER':<32} {'STATE':<8} {'HOST':<16} {'PID':>7} {'CONC':>4}  HEARTBEAT")
    for r in records:
        state = "live" if r.live else ("stopped" if r.stopped_at else "expired")
        click.echo(
            f"{r.worker_id:<32} {state:<8} {r.host[:16]:<16} {r.pid:>7} {r.concurrency:>4}  "
            f"{r.heartbeat_at:%Y-%m-%d %H:%M:%S}"
        )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def doctor(settings: Settings, as_json: bool) -> None:
    """Check the database, schema, clock, queue, leases, reconciliation and workers.

    Exits 1 when a finding needs action.
    """
    if settings.embedded:  # every other command migrates the embedded server: so does this
        run_in_store(settings, _opened)
    dsn = settings.resolve_dsn()
    findings = run_async(lambda: diagnose(dsn), settings.event_loop)
    if as_json:
        echo_json([dataclasses.asdict(f) for f in findings])
    else:
        marks = {"ok": "ok  ", "warning": "WARN", "action": "FIX "}
        for finding in findings:
            click.echo(f"{marks[finding.level]} {finding.check:<22} {finding.message}")
    if any(f.level == "action" for f in findings):
        sys.exit(1)


async def _opened(store: Store) -> None:
    """Nothing more to do: opening the store migrated it."""
