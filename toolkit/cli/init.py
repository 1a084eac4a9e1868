"""``init``: a new project in one command, ready for ``toolkit run`` as it stands.

The files come from ``toolkit/cli/new_project/``: one definition, the application module
with its handler, a README of the next commands and a ``.gitignore`` (issue 24, item 1);
the definition format's JSON Schema is copied from the installed package, for editors; an
empty ``.toolkit`` folder makes the project's commands use an embedded server of its own.
"""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.definition import schema_path
from toolkit.errors import ConfigError
from toolkit.store.embedded import HOME_NAME

#: The files a new project starts with, beside this module.
TEMPLATE = Path(__file__).resolve().parent / "new_project"
#: Where the JSON Schema goes: the template definition's ``$schema`` line points here.
SCHEMA = "schemas/workflow.schema.json"
FILES = ("definitions/hello.yaml", "workflows.py", "README.md", ".gitignore", SCHEMA)


@click.command()
@click.argument(
    "folder", default=".", type=click.Path(file_okay=False, path_type=Path), required=False
)
def init(folder: Path) -> None:
    """Start a project in FOLDER (default: here): a definition, its handlers, a README.

    Nothing is overwritten: when one of the files exists already, nothing is written.
    """
    existing = [name for name in FILES if (folder / name).exists()]
    if existing:
        raise ConfigError(
            f"{folder / existing[0]} exists already; nothing was written (choose an empty "
            "folder: toolkit init FOLDER)"
        )
    for name in FILES:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        template = TEMPLATE / name.replace(".gitignore", "gitignore")
        target.write_text((schema_path() if name == SCHEMA else template).read_text())
    # The project's own home: commands run here (or below) use it, not one further up.
    (folder / HOME_NAME).mkdir(exist_ok=True)
    click.echo(f"created {', '.join(str(folder / name) for name in FILES)}")
    click.echo("next:" if folder == Path(".") else f"next, in {folder}:")
    click.echo("  toolkit validate --app workflows definitions/")
    click.echo("  toolkit deploy definitions/")
    click.echo("  toolkit submit hello --input '{\"name\": \"Ada\"}'")
    click.echo("  toolkit run --app workflows --until-idle")
    click.echo("  toolkit show 1")
