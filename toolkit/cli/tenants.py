"""``tenants``: admission settings (weight, active limit, pause) and budgets per tenant."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import click

from toolkit.cli.options import resource_amounts, setting_change
from toolkit.cli.output import echo_json
from toolkit.cli.session import Settings, run_in_store
from toolkit.errors import ConfigError, UnknownTenant
from toolkit.store import Store
from toolkit.store.tenants import TenantRecord


@click.group()
def tenants() -> None:
    """Tenant admission: weights, active limits, pause, budgets."""


@tenants.command("set")
@click.argument("tenant")
@click.option(
    "--max-active",
    type=click.IntRange(min=1),
    help="Most leased tasks of the tenant at once, over every worker.",
)
@click.option("--no-max-active", is_flag=True, help="Remove the tenant's limit.")
@click.option(
    "--weight",
    type=click.IntRange(min=1),
    help="The tenant's share of the leased slots against other busy tenants (new: 1).",
)
@click.option(
    "--paused/--resumed",
    default=None,
    help="Stop claiming the tenant's tasks (leased ones run on), or claim them again.",
)
@click.option(
    "--budget",
    "budgets",
    multiple=True,
    metavar="RESOURCE=AMOUNT",
    help="Set the amount of a budget (repeatable); what was used stays.",
)
@click.option(
    "--clear-budget",
    "cleared",
    multiple=True,
    metavar="RESOURCE",
    help="Remove a budget (repeatable).",
)
@click.pass_obj
def tenants_set(
    settings: Settings,
    tenant: str,
    max_active: int | None,
    no_max_active: bool,
    weight: int | None,
    paused: bool | None,
    budgets: Sequence[str],
    cleared: Sequence[str],
) -> None:
    """Create or change TENANT's settings; what is not given stays.

    A new tenant starts with weight 1, no limit, not paused. Workers apply the change at
    their next claim; tasks already leased keep their leases.
    """
    changes: dict[str, Any] = setting_change("max-active", max_active, no_max_active)
    amounts: dict[str, str | None] = dict(resource_amounts(budgets))
    for resource in cleared:
        if resource in amounts:
            raise ConfigError(f"budget {resource!r}: given to --budget and --clear-budget")
        amounts[resource] = None
    if weight is not None:
        changes["weight"] = weight
    if paused is not None:
        changes["paused"] = paused

    async def set_tenant(store: Store) -> tuple[set[str], TenantRecord]:
        try:
            before = set((await store.tenants.get(tenant)).budgets)
        except UnknownTenant:
            before = set()
        return before, await store.tenants.set(tenant, budgets=amounts, **changes)

    before, record = run_in_store(settings, set_tenant)
    for resource in cleared:
        if resource not in before:
            click.echo(f"note: tenant {tenant} had no budget {resource!r} to clear", err=True)
    limit = "no limit" if record.max_active is None else f"max active {record.max_active}"
    click.echo(
        f"tenant {record.tenant}: {limit}, weight {record.weight}"
        f"{', paused' if record.paused else ''}; budgets: {_budgets_text(record)}"
    )


@tenants.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tenants_list(settings: Settings, as_json: bool) -> None:
    """Each tenant: settings, live task counts, budgets (used of amount)."""
    records = run_in_store(settings, lambda store: store.tenants.list())
    if as_json:
        rows = [
            {
                **dataclasses.asdict(r),
                "budgets": {
                    name: {
                        "amount": _number(b.amount),
                        "used": _number(b.used),
                        "reserved": _number(b.reserved),
                    }
                    for name, b in r.budgets.items()
                },
            }
            for r in records
        ]
        echo_json(rows)
        return
    click.echo(
        f"{'TENANT':<20} {'WEIGHT':>6} {'MAX':>5} {'PAUSED':<6} {'QUEUED':>7} {'LEASED':>6} "
        f"{'WAITING':>7}  BUDGETS (used/amount)"
    )
    for r in records:
        click.echo(
            f"{r.tenant:<20} {r.weight:>6} {'-' if r.max_active is None else r.max_active:>5} "
            f"{'yes' if r.paused else 'no':<6} {r.queued:>7} {r.leased:>6} {r.waiting:>7}  "
            f"{_budgets_text(r)}"
        )


def _number(value: Decimal) -> int | float:
    """A budget amount as JSON shows it: whole amounts as integers."""
    return int(value) if value == value.to_integral_value() else float(value)


def _budgets_text(record: TenantRecord) -> str:
    """The tenant's budgets on one line: used of amount, and what is reserved."""
    parts = []
    for name, b in record.budgets.items():
        held = f" ({_number(b.reserved)} reserved)" if b.reserved else ""
        parts.append(f"{name} {_number(b.used)}/{_number(b.amount)}{held}")
    return ", ".join(parts) or "-"
