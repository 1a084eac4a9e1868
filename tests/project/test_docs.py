"""The docs stay true to the code.

The format reference covers the schema, the CLI page every command, the history page every
event kind, and the state diagram every task state and wait reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

from toolkit.cli import cli
from toolkit.definition import schema_path
from toolkit.lifecycle import EventKind, TaskState, WaitReason
from toolkit.store.migrations import SchemaStatus, available_migrations

DOCS = Path(__file__).resolve().parents[2] / "docs"


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
    """Under each command's heading (``## toolkit schedules``, ``### toolkit db migrate``),
    the help block is that command's own ``--help``, and every command has one.

    Regression: the schedules sections once showed the top-level help, which a check keyed
    on each block's own ``Usage:`` line took for the top-level command's and passed.
    """
    page = (DOCS / "cli.md").read_text()
    sections = re.findall(
        r"^#{2,3} (toolkit(?: [a-z-]+)*)\n(.*?)(?=^#{1,3} |\Z)", page, flags=re.S | re.M
    )
    documented = set()
    for heading, body in sections:
        args = heading.split()[1:]
        blocks = re.findall(r"```text\n(Usage: toolkit.*?)\n```", body, flags=re.S)
        assert blocks, f"docs/cli.md: no help block under '{heading}'"
        result = CliRunner().invoke(cli, [*args, "--help"], prog_name="toolkit", terminal_width=80)
        assert result.output.rstrip("\n") == blocks[0], f"docs/cli.md is stale for: {heading}"
        documented.add(tuple(args))
    missing = [" ".join(("toolkit", *c)) for c in _commands(cli) if c not in documented]
    assert not missing, f"docs/cli.md has no section for: {missing}"


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under ``group``, as the words that name it."""
    found: list[tuple[str, ...]] = []
    for name, command in group.commands.items():
        if command.hidden:
            continue
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
    return found


def test_cli_reference_shows_the_schema_version_this_toolkit_needs() -> None:
    """Regression: the outdated-schema example said `needs 1` long after migration 0002."""
    page = (DOCS / "cli.md").read_text()
    (shown,) = re.findall(r"error: the database schema is at version 0, this toolkit .*", page)
    empty = SchemaStatus((), tuple(m.version for m in available_migrations()))
    needed = f"this toolkit needs {empty.expected}: run `toolkit db migrate`"
    assert shown.endswith(needed), f"docs/cli.md: {shown!r}; the toolkit says {needed!r}"


def _section(page: str, heading: str) -> str:
    """The lines under ``heading`` up to the next heading of its level or above.

    Args:
        page: a Markdown page.
        heading: the heading line, e.g. ``"## Event kinds"``.

    Returns:
        The section without its heading; lines inside code fences never end it.
    """
    lines = page.splitlines()
    first = lines.index(heading) + 1
    level = len(heading) - len(heading.lstrip("#"))
    fenced = False
    for number, line in enumerate(lines[first:], start=first):
        fenced ^= line.lstrip().startswith("```")
        marks = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < marks <= level and line[marks : marks + 1] == " ":
            return "\n".join(lines[first:number])
    return "\n".join(lines[first:])


def test_history_event_table_matches_the_event_kinds() -> None:
    """docs/history.md has one row per `EventKind`, and no row of a kind the enum lacks."""
    table = _section((DOCS / "history.md").read_text(), "## Event kinds")
    rows = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M)
    kinds = {kind.value for kind in EventKind}
    missing = sorted(kinds - set(rows))
    unknown = sorted(set(rows) - kinds)
    twice = sorted({row for row in rows if rows.count(row) > 1})
    assert not missing, f"docs/history.md does not document the event kinds: {missing}"
    assert not unknown, f"docs/history.md documents event kinds that do not exist: {unknown}"
    assert not twice, f"docs/history.md documents these event kinds twice: {twice}"


def _state_diagram() -> str:
    """The Mermaid state diagram of docs/concepts.md (its task states and lease transitions)."""
    section = _section((DOCS / "concepts.md").read_text(), "## Task states and lease transitions")
    diagrams = re.findall(r"```mermaid\n(stateDiagram-v2\n.*?)```", section, flags=re.S)
    assert len(diagrams) == 1, "expected one state diagram in docs/concepts.md"
    return str(diagrams[0])


def test_state_diagram_names_every_task_state_and_wait_reason() -> None:
    """Every `TaskState` is a state of the diagram, every `WaitReason` a state inside `waiting`.

    The diagram draws nothing else: besides the task states and the start/end marker, only
    ``recoverable`` (a leased row whose lease expired); inside ``waiting`` only wait reasons.
    """
    diagram = _state_diagram()
    inner = re.search(r"^\s*state waiting \{\n(.*?)^\s*\}", diagram, flags=re.S | re.M)
    assert inner is not None, "the state diagram has no composite state `waiting`"
    words = [line.strip() for line in inner.group(1).splitlines()]
    reasons = {word for word in words if word and not word.startswith("direction ")}
    ends = re.findall(r"^\s*(\S+) --> ([^\s:]+)", diagram, flags=re.M)
    states = {state for pair in ends for state in pair} | {"waiting"}
    outside = states - reasons - {"[*]"}
    missing_reasons = sorted({reason.value for reason in WaitReason} - reasons)
    unknown_reasons = sorted(reasons - {reason.value for reason in WaitReason})
    missing_states = sorted({state.value for state in TaskState} - states)
    unknown_states = sorted(outside - {state.value for state in TaskState} - {"recoverable"})
    assert not missing_reasons, f"the state diagram lacks the wait reasons {missing_reasons}"
    assert not unknown_reasons, f"the state diagram has unknown wait reasons {unknown_reasons}"
    assert not missing_states, f"the state diagram lacks the task states {missing_states}"
    assert not unknown_states, f"the state diagram has unknown states {unknown_states}"
