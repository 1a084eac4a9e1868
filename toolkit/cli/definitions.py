"""Definitions: ``validate`` files, ``deploy`` versions, and the ``definitions`` group."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import click

from toolkit.cli.apps import check_option, checked_app, load_app, yaml_line
from toolkit.cli.output import echo_json
from toolkit.cli.session import Settings, run_in_store
from toolkit.definition import WorkflowDefinition, load_definitions
from toolkit.errors import ConfigError, DefinitionError, DefinitionFault
from toolkit.store import Store
from toolkit.store.definitions import DeployOutcome
from toolkit.store.schedules import Schedule


def load_by_line(
    paths: Sequence[Path], *, accept_new_only: bool = False
) -> list[WorkflowDefinition]:
    """:func:`~toolkit.definition.load_definitions`, its faults file by file in line order.

    The library leads each file's faults with the schema's best match; a person reading
    them in a terminal goes down the file, so the commands print them by line (a fault of
    the whole file, without a line, first).

    Raises:
        DefinitionError: the faults, files in load order, each file's by line.
    """
    try:
        return load_definitions(paths, accept_new_only=accept_new_only)
    except DefinitionError as exc:
        raise _by_line(exc.faults, exc.loaded) from None


def _by_line(
    faults: Sequence[DefinitionFault], loaded: Sequence[WorkflowDefinition] = ()
) -> DefinitionError:
    """The faults file by file (in the order the files first appear), each file's by line."""
    files = list(dict.fromkeys(fault.file for fault in faults))
    return DefinitionError(
        sorted(faults, key=lambda fault: (files.index(fault.file), fault.line or 0)),
        loaded=loaded,
    )


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@check_option()
def validate(paths: Sequence[Path], app_spec: str | None) -> None:
    """Validate workflow definitions (files or folders); list every fault."""
    try:
        definitions = load_by_line(paths)
    except DefinitionError as exc:
        # the files that did load are checked against the app too: every fault at once
        raise _by_line([*exc.faults, *_handler_faults(app_spec, exc.loaded)]) from None
    checked_app(app_spec, definitions)
    for definition in definitions:
        click.echo(
            f"ok: {definition.source}: {definition.name} v{definition.version} "
            f"{definition.digest[:12]}"
        )


def _handler_faults(
    app_spec: str | None, definitions: Sequence[WorkflowDefinition]
) -> list[DefinitionFault]:
    """The handler faults of ``definitions`` against the app of ``--app``.

    None without the option, or when the app cannot be loaded: that error comes once the
    definitions' own faults are fixed.
    """
    if app_spec is None or not definitions:
        return []
    try:
        app = load_app(app_spec)
    except ConfigError:
        return []
    return app.handler_faults(definitions, yaml_line)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@check_option(limits=True)
@click.pass_obj
def deploy(settings: Settings, paths: Sequence[Path], app_spec: str | None) -> None:
    """Register definition versions (a no-op for an unchanged version)."""
    definitions = load_by_line(paths)
    app = checked_app(app_spec, definitions)

    async def register(store: Store) -> tuple[list[DeployOutcome], list[Schedule], list[str]]:
        if app is not None:  # as a worker checks them, with the limits an operator set
            app.check_limits(definitions, {limit.name for limit in await store.limits.list()})
        outcomes = await store.definitions.deploy_all(definitions)
        names = sorted({d.name for d in definitions if d.schedules})
        declared = [s for name in names for s in await store.schedules.list(name)]
        warnings = []
        for definition in definitions:
            unknown, known = await store.events.unknown_triggers(definition)
            warnings += [
                f"warning: {definition.name} v{definition.version} has a trigger for event "
                f"{event!r}, which no definition declares or awaits and none was emitted; "
                f"known events: {', '.join(known) or '(none)'}"
                for event in unknown
            ]
        return outcomes, [s for s in declared if s.owner == "definition"], warnings

    outcomes, declared, warnings = run_in_store(settings, register)
    for warning in warnings:
        click.echo(warning, err=True)
    for definition, outcome in zip(definitions, outcomes, strict=True):
        click.echo(f"{outcome}: {definition.name} v{definition.version} {definition.digest[:12]}")
        for schedule in declared:
            if (schedule.definition_name, schedule.owner_version) == (
                definition.name, definition.version
            ):  # fmt: skip
                click.echo(
                    f"  schedule {schedule.name}: {schedule.cadence.describe()}, next tick "
                    f"{schedule.next_tick:%Y-%m-%d %H:%M:%S %Z}"
                )


@click.group()
def definitions() -> None:
    """Registered definition versions: list, retire, restore, delete."""


@definitions.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def definitions_list(settings: Settings, as_json: bool) -> None:
    """Each version with task counts by state and whether a live worker serves it."""
    entries = run_in_store(settings, lambda store: store.definitions.list())
    if as_json:
        echo_json([{**dataclasses.asdict(e), "unavailable": e.unavailable} for e in entries])
        return
    click.echo(
        f"{'DEFINITION':<28} {'DIGEST':<12}  {'STATUS':<8} {'SERVED':<6} {'UNAVAIL':>7}  TASKS"
    )
    for e in entries:
        counts = ", ".join(f"{state} {n}" for state, n in sorted(e.task_counts.items())) or "-"
        click.echo(
            f"{e.name + ' v' + str(e.version):<28} {e.digest[:12]}  "
            f"{'retired' if e.retired else 'active':<8} {'yes' if e.served else 'no':<6} "
            f"{e.unavailable:>7}  {counts}"
        )


@definitions.command("retire")
@click.argument("name")
@click.argument("version", type=int)
@click.pass_obj
def definitions_retire(settings: Settings, name: str, version: int) -> None:
    """Stop new submissions to NAME VERSION (its tasks run on)."""
    run_in_store(settings, lambda store: store.definitions.retire(name, version))
    click.echo(f"retired: {name} v{version}")


@definitions.command("restore")
@click.argument("name")
@click.argument("version", type=int)
@click.pass_obj
def definitions_restore(settings: Settings, name: str, version: int) -> None:
    """Take new submissions to a retired NAME VERSION again."""
    run_in_store(settings, lambda store: store.definitions.restore(name, version))
    click.echo(f"restored: {name} v{version}")


@definitions.command("delete")
@click.argument("name")
@click.argument("version", type=int)
@click.pass_obj
def definitions_delete(settings: Settings, name: str, version: int) -> None:
    """Delete NAME VERSION; refused while queued, leased or waiting tasks reference it."""
    run_in_store(settings, lambda store: store.definitions.delete(name, version))
    click.echo(f"deleted: {name} v{version}")
