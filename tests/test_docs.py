"""The docs stay true to the code: the format reference covers the schema, the CLI page every
command."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from toolkit.cli import cli
from toolkit.definition import schema_path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _properties(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for name, child in node.items():
            if name == "properties" and isinstance(child, dict):
                yield from child
            yield from _properties(child)
    elif isinstance(node, list):
        for child in node:
            yield from _properties(child)


def test_definition_reference_names_every_schema_property() -> None:
    schema = json.loads(schema_path().read_text())
    page = (DOCS / "definitions.md").read_text()
    paths = re.findall(r"`([A-Za-z_][A-Za-z0-9_.\[\]]*)", page)  # `retry.max`, `catch[].next`
    named = {part for path in paths for part in re.split(r"[.\[\]]+", path) if part}
    missing = sorted(set(_properties(schema)) - named)
    assert not missing, f"docs/definitions.md does not mention: {missing}"


def test_cli_reference_names_every_command() -> None:
    page = (DOCS / "cli.md").read_text()
    commands = list(cli.commands)
    missing = [name for name in commands if f"toolkit {name}" not in page]
    assert not missing, f"docs/cli.md does not document: {missing}"


def test_cli_reference_help_blocks_match_the_real_help() -> None:
    page = (DOCS / "cli.md").read_text()
    blocks = re.findall(r"```text\n(Usage: toolkit.*?)\n```", page, flags=re.S)
    assert len(blocks) >= len(cli.commands)
    for block in blocks:
        usage = block.splitlines()[0].split()[2:]  # Usage: toolkit db migrate [OPTIONS]
        args = [word for word in usage if word.islower()]
        result = CliRunner().invoke(cli, [*args, "--help"], prog_name="toolkit", terminal_width=80)
        stale = f"docs/cli.md is stale for: toolkit {' '.join(args)}"
        assert result.output.rstrip("\n") == block, stale
