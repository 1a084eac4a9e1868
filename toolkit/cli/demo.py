"""``demo``: the example definitions run on real input against the store, then a summary."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from toolkit.cli.session import Settings, run_in_store
from toolkit.errors import ConfigError


@click.command()
@click.option(
    "--definitions",
    "definitions_dir",
    default="definitions",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
)
@click.option("--concurrency", default=16, show_default=True)
@click.pass_obj
def demo(settings: Settings, definitions_dir: Path, concurrency: int) -> None:
    """Deploy the example definitions, submit tasks on real input, run a worker until drained."""
    from toolkit.examples.orders import CarrierBusy
    from toolkit.ops.demo import run_demo

    if not definitions_dir.is_dir():
        raise ConfigError(
            f"--definitions {definitions_dir}: no such folder; the demo reads the repository's"
            " definitions/ (and definitions/data/): run it from the repository's root, or give"
            " --definitions"
        )
    def progress(line: str) -> None:
        click.echo(line, err=True)

    # The busy carrier's failed attempts are the demo's plan, counted in its summary: their
    # warnings (each with a traceback) would read as if the demo had gone wrong.
    planned = _Unless(action="effect_failed", error=CarrierBusy.__name__)
    worker_log = logging.getLogger("toolkit.engine.interpreter")
    worker_log.addFilter(planned)
    try:
        summary = run_in_store(
            settings,
            lambda store: run_demo(
                store, definitions_dir, home=settings.home, concurrency=concurrency,
                progress=progress,
            ),
            pool_size=concurrency + 2,
        )  # fmt: skip
    finally:
        worker_log.removeFilter(planned)
    click.echo(summary.render())
    shown = summary.reconciled[0].task_id if summary.reconciled else 1
    click.echo("")
    click.echo("what next")
    click.echo("  toolkit tasks --limit 5                 the newest tasks")
    click.echo(f"  toolkit show {shown:<26} a task: its steps, evidence and events")
    click.echo("  toolkit export history/ && toolkit stats history/")
    click.echo('  pip install -e ".[notebook]" && jupyter lab notebooks/    the tutorials')
    if settings.embedded:
        click.echo(
            f"(the embedded PostgreSQL keeps running with its data in "
            f"{settings.home.resolve()}/pgdata; `toolkit db stop` stops it)"
        )


class _Unless(logging.Filter):
    """Drops the log records whose ``extra`` fields have all of the given values."""

    def __init__(self, **fields: str) -> None:
        super().__init__()
        self._fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop it) when ``record`` has every one of the fields' values."""
        return not all(getattr(record, k, None) == v for k, v in self._fields.items())
