"""``toolkit emit`` and ``toolkit events``: record an event, and read the events back."""

from __future__ import annotations

import json

import click

from toolkit.cli.options import json_option
from toolkit.cli.session import Settings, run_in_store
from toolkit.store.events import MAX_LISTED


@click.command()
@click.argument("name")
@click.option("--payload", help="Event payload as JSON.")
@click.option("--key", help="De-duplicates: a second emit of this key is the first event.")
@click.option("--tenant", default="default", show_default=True, help="The event's tenant.")
@click.pass_obj
def emit(settings: Settings, name: str, payload: str | None, key: str | None, tenant: str) -> None:
    """Record event NAME: it starts the tasks its triggers start and reaches matching waits.

    The emit is durable when the command returns; it prints the event's id, the tasks it
    started and those it was delivered to (docs/events.md).
    """
    value = json_option(payload, "--payload")
    done = run_in_store(
        settings, lambda store: store.events.emit(name, value, key=key, tenant=tenant)
    )
    if done.duplicate:
        click.echo(f"event {done.event_id}: key {key!r} was emitted before; nothing done again")
        return
    click.echo(f"event {done.event_id} emitted")
    if done.started:
        click.echo(f"  started: {', '.join(f'task {i}' for i in done.started)}")
    if done.delivered:
        click.echo(f"  delivered to: {', '.join(f'task {i}' for i in done.delivered)}")
    if done.cancelled:
        click.echo(f"  cancelled: {', '.join(f'task {i}' for i in done.cancelled)}")
    for task_id in done.ended:
        click.echo(f"  task {task_id} has the trigger's key and has ended: nothing started")
    if not (done.started or done.delivered or done.ended or done.cancelled):
        click.echo(
            "  no trigger started a task, and no task waiting for it now matched; a task "
            "submitted before it takes it when it reaches its wait"
        )


@click.group()
def events() -> None:
    """Read the events emitted (docs/events.md)."""


@events.command("list")
@click.option("--name", help="Events of this name.")
@click.option("--tenant", help="Events of this tenant.")
@click.option("--since", "since_text", metavar="TIME",
              help="Emitted at or after TIME: a time (2026-06-01T12:00+02:00) or a duration "
                   "before now (30m, 2d).")  # fmt: skip
@click.option("--limit", type=click.IntRange(1, MAX_LISTED), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@click.pass_obj
def list_events(
    settings: Settings,
    name: str | None,
    tenant: str | None,
    since_text: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List events, newest first: what each started and whom it was delivered to."""
    found = run_in_store(
        settings,
        lambda store: store.events.list(name=name, tenant=tenant, since=since_text, limit=limit),
    )
    for event in found:
        if as_json:
            click.echo(json.dumps({
                "id": event.id, "tenant": event.tenant, "name": event.name, "key": event.key,
                "payload": event.payload, "emitted_at": event.emitted_at.isoformat(),
                "started": list(event.started), "delivered": list(event.delivered),
                "cancelled": list(event.cancelled),
            }))  # fmt: skip
            continue
        key = f" key={event.key}" if event.key else ""
        cancelled = f"  cancelled {list(event.cancelled)}" if event.cancelled else ""
        click.echo(
            f"{event.id:>7}  {event.emitted_at:%Y-%m-%d %H:%M:%S}  {event.tenant}  "
            f"{event.name}{key}  started {list(event.started)}  delivered "
            f"{list(event.delivered)}{cancelled}"
        )
    if not found and not as_json:
        click.echo("no event")
