"""``limits``: fleet-wide concurrency and rate limits of effects, listed and set at run time."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from toolkit.cli.options import setting_change
from toolkit.cli.output import echo_json
from toolkit.cli.session import Settings, run_in_store


@click.group()
def limits() -> None:
    """Downstream limits: fleet-wide concurrency and rate limits of effects."""


@limits.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def limits_list(settings: Settings, as_json: bool) -> None:
    """Each limit: settings, slots in use, tasks waiting, source."""
    records = run_in_store(settings, lambda store: store.limits.list())
    if as_json:
        echo_json([dataclasses.asdict(r) for r in records])
        return
    click.echo(
        f"{'LIMIT':<20} {'MAX':>5} {'IN USE':>6} {'RATE/S':>8} {'BURST':>6} {'PER':<7} "
        f"{'WAITING':>7}  SOURCE"
    )
    for r in records:
        click.echo(
            f"{r.name:<20} {_or_dash(r.max_concurrency):>5} {r.in_use:>6} "
            f"{_or_dash(r.rate_per_second):>8} {_or_dash(r.burst):>6} "
            f"{'tenant' if r.per_tenant else 'global':<7} {r.waiting:>7}  {r.source}"
        )


def _or_dash(value: float | None) -> str:
    """A bound as a table shows it: ``-`` for none."""
    return "-" if value is None else f"{value:g}"


@limits.command("set")
@click.argument("name")
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    help="Most calls inside the limit at once, over every worker.",
)
@click.option("--no-max-concurrency", is_flag=True, help="Remove the concurrency bound.")
@click.option("--rate", help="Calls allowed on average, e.g. 600/min, 20/s, 5/h.")
@click.option("--no-rate", is_flag=True, help="Remove the rate (and its burst).")
@click.option(
    "--burst",
    type=click.FloatRange(min=1),
    help="Most calls at once after a quiet spell (new rate: one second's worth).",
)
@click.option(
    "--per",
    type=click.Choice(["tenant", "global"]),
    help="One set of slots and bucket per tenant, or one for all (new: global).",
)
@click.pass_obj
def limits_set(
    settings: Settings,
    name: str,
    max_concurrency: int | None,
    no_max_concurrency: bool,
    rate: str | None,
    no_rate: bool,
    burst: float | None,
    per: str | None,
) -> None:
    """Create or change the limit NAME at run time; what is not given stays.

    The limit becomes the operator's: a worker's start no longer rewrites it with the
    application's declaration. Workers apply it at their next acquisition; calls inside
    the limit finish.
    """
    changes: dict[str, Any] = setting_change("max-concurrency", max_concurrency, no_max_concurrency)
    changes |= setting_change("rate", rate, no_rate)
    if burst is not None:
        changes["burst"] = burst
    if per is not None:
        changes["per"] = per
    r = run_in_store(settings, lambda store: store.limits.set(name, **changes))
    bounds = []
    if r.max_concurrency is not None:
        bounds.append(f"max concurrency {r.max_concurrency}")
    if r.rate_per_second is not None:
        bounds.append(f"rate {r.rate_per_second:g}/s, burst {_or_dash(r.burst)}")
    click.echo(
        f"limit {r.name}: {', '.join(bounds) or 'no bound'}"
        f"{', per tenant' if r.per_tenant else ''} ({r.source})"
    )
