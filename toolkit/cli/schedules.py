"""``toolkit schedules``: recurring schedules, made and run in the store (docs/schedules.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from toolkit.cli.filters import tag_options
from toolkit.cli.options import json_option, time_option
from toolkit.cli.output import aligned, echo_json, json_line
from toolkit.cli.session import Settings, run_in_store
from toolkit.definition.schedules import OVERLAPS, parse_catchup
from toolkit.errors import ConfigError
from toolkit.store import Store
from toolkit.store.schedules import Schedule


@click.group()
def schedules() -> None:
    """Recurring schedules: each tick starts one task of a definition's newest version."""


def _settings_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options a schedule is made or changed with."""
    options = [
        click.option("--cron", help="A cron expression (five fields, or @hourly, @daily ...)."),
        click.option("--every", metavar="DURATION", help="Instead of --cron: an interval (15m)."),
        click.option("--offset", metavar="DURATION", help="With --every: where in the interval."),
        click.option("--timezone", metavar="TZ", help="With --cron: an IANA zone. Default UTC."),
        click.option("--input", "input_json", help="The task input as JSON; may use "
                     "${ context.scheduled_at } and ${ context.schedule }."),
        click.option("--tenant", help="The tenant of its tasks. Default: default."),
        click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE",
                     help="Tag its tasks (repeatable)."),
        click.option("--overlap", type=click.Choice(OVERLAPS),
                     help="A tick while a run is live. Default: skip."),
        click.option("--catchup", metavar="none|latest|all WINDOW",
                     help="Ticks missed while no worker ran: none, latest (the default), or "
                     "'all 6h' (each no older than 6h)."),
        click.option("--pause-after-failures", type=click.IntRange(min=1), metavar="N",
                     help="Pause after N consecutive failed runs."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _changes(options: dict[str, Any]) -> dict[str, Any]:
    """The given options as fields of ``Schedules.create`` / ``update``.

    Raises:
        ConfigError: a bad ``--input``, ``--tag`` or ``--catchup``.
    """
    found: dict[str, Any] = {
        key: value for key, value in options.items()
        if value is not None and key not in ("input_json", "tags", "catchup")
    }  # fmt: skip
    if options.get("input_json") is not None:
        found["input"] = json_option(options["input_json"], "--input")
    if options.get("tags"):
        found["tags"] = tag_options(options["tags"])
    catchup = options.get("catchup")
    if catchup is not None:
        try:
            found["catchup"], found["catchup_window"] = parse_catchup(catchup)
        except ValueError as exc:
            raise ConfigError(f"--catchup: {exc}") from None
    return found


@schedules.command("create")
@click.argument("name")
@click.option("--definition", required=True, help="The definition its ticks start.")
@_settings_options
@click.pass_obj
def create(settings: Settings, /, name: str, definition: str, **options: Any) -> None:
    """Make schedule NAME; prints its next ticks."""
    fields = _changes(options)
    schedule = run_in_store(
        settings, lambda store: store.schedules.create(name, definition, **fields)
    )
    click.echo(f"schedule {schedule.name}: {schedule.describe()}")
    click.echo(f"  next tick: {schedule.next_tick:%Y-%m-%d %H:%M:%S %Z}")


@schedules.command("update")
@click.argument("name")
@_settings_options
@click.pass_obj
def update(settings: Settings, /, name: str, **options: Any) -> None:
    """Change schedule NAME (made at run time); the options not given stay."""
    fields = _changes(options)
    if not fields:
        raise ConfigError("give at least one option to change")
    schedule = run_in_store(settings, lambda store: store.schedules.update(name, **fields))
    click.echo(f"schedule {schedule.name}: {schedule.describe()}")


def _state(schedule: Schedule) -> str:
    """``active``, or ``paused`` with the note saying why when there is one."""
    if not schedule.paused:
        return "active"
    note = schedule.pause_note
    return f"paused ({note})" if note and note != "paused" else "paused"


@schedules.command("list")
@click.option("--definition", help="Only the schedules of this definition.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_schedules(settings: Settings, definition: str | None, as_json: bool) -> None:
    """List the schedules, with their owner and next tick."""
    found = run_in_store(settings, lambda store: store.schedules.list(definition))
    if as_json:
        echo_json([_json(s) for s in found])
        return
    rows = [["NAME", "DEFINITION", "OWNER", "CADENCE", "NEXT TICK", "LIVE", "STATE"]] + [
        [s.name, s.definition_name, s.owner, s.cadence.describe(),
         f"{s.next_tick:%Y-%m-%d %H:%M:%S}", str(s.live), _state(s)]
        for s in found
    ]  # fmt: skip
    for line in aligned(rows, right={5}):
        click.echo(line)


@schedules.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def show(settings: Settings, name: str, as_json: bool) -> None:
    """Show schedule NAME: its settings, counters and recent runs."""

    async def read(store: Store) -> tuple[Schedule, list[Any]]:
        schedule = await store.schedules.get(name)
        return schedule, await store.tasks.list(schedule=name, limit=5)

    schedule, runs = run_in_store(settings, read)
    if as_json:
        echo_json({**_json(schedule), "recent_runs": [dataclasses.asdict(r) for r in runs]})
        return
    click.echo(f"schedule {schedule.name}: {schedule.describe()}")
    rows = [
        ("owner", schedule.owner + (f" ({schedule.definition_name} v{schedule.owner_version})"
                                    if schedule.owner_version else "")),
        ("state", _state(schedule)),
        ("next tick", f"{schedule.next_tick:%Y-%m-%d %H:%M:%S %Z}"),
        ("input", json_line(schedule.input)),
        ("ticks", f"fired {schedule.fired}, skipped {schedule.skipped}, missed "
                  f"{schedule.missed}, caught up {schedule.caught_up}"),
        ("failures", f"{schedule.consecutive_failures} in a row"
                     + (f" (pauses at {schedule.pause_after_failures})"
                        if schedule.pause_after_failures else "")),
        ("live runs", str(schedule.live)),
    ]  # fmt: skip
    if schedule.buffered:
        rows.append(("buffered", ", ".join(f"{t:%H:%M:%S}" for t in schedule.buffered)))
    for label, value in rows:
        click.echo(f"  {label + ':':<11} {value}")
    for run in runs:
        tick = run.scheduled_at
        click.echo(f"  run:        task {run.id} {run.state}, tick {tick:%Y-%m-%d %H:%M:%S}")


def _json(schedule: Schedule) -> dict[str, Any]:
    data = dataclasses.asdict(schedule)
    data["cadence"] = schedule.cadence.describe()
    return data


def _name_command(
    verb: str, doc: str, act: Callable[[Store, str], Any], done: Callable[[Any], str]
) -> click.Command:
    """A command that takes a schedule's name and does one thing with it."""

    @click.pass_obj
    def command(settings: Settings, name: str) -> None:
        click.echo(done(run_in_store(settings, lambda store: act(store, name))))

    command.__doc__ = doc
    return schedules.command(verb)(click.argument("name")(command))


_name_command(
    "resume", "Resume schedule NAME from its next tick after now.",
    lambda store, name: store.schedules.resume(name),
    lambda s: f"schedule {s.name} resumed; next tick {s.next_tick:%Y-%m-%d %H:%M:%S %Z}",
)  # fmt: skip
_name_command(
    "trigger", "Start one run of schedule NAME now (whatever its overlap policy).",
    lambda store, name: store.schedules.trigger(name),
    lambda task_id: f"task {task_id} started",
)  # fmt: skip
_name_command(
    "delete", "Delete schedule NAME; its live runs go on.",
    lambda store, name: store.schedules.delete(name),
    lambda _: "deleted",
)  # fmt: skip


@schedules.command("pause")
@click.argument("name")
@click.option("--note", help="Why (shown by list and show).")
@click.pass_obj
def pause(settings: Settings, name: str, note: str | None) -> None:
    """Pause schedule NAME: no tick fires until it is resumed."""
    run_in_store(settings, lambda store: store.schedules.pause(name, note))
    click.echo(f"schedule {name} paused")


@schedules.command("backfill")
@click.argument("name")
@click.option("--from", "start_text", required=True, metavar="TIME", help="After this time.")
@click.option("--to", "end_text", required=True, metavar="TIME", help="Up to this time.")
@click.pass_obj
def backfill(settings: Settings, name: str, start_text: str, end_text: str) -> None:
    """Start a run of schedule NAME for each tick in (--from, --to] that has none."""
    start = time_option(start_text, "--from")
    end = time_option(end_text, "--to")
    ids = run_in_store(settings, lambda store: store.schedules.backfill(name, start, end))
    click.echo(f"{len(ids)} runs started" + (f": tasks {ids[0]} to {ids[-1]}" if ids else ""))
