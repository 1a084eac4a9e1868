"""Loading workflow definitions: read, validate, graph-check, build and digest them.

A definition is a YAML (or JSON) document in the format described by
``schemas/workflow.schema.json`` (format v1). Loading it:

1. parses the YAML with a safe loader, remembering the line of every value
   and refusing duplicate keys;
2. validates it against the JSON Schema;
3. checks what the schema cannot express: ``start`` and every ``next`` /
   ``default`` / ``catch`` target exist, every step is reachable from
   ``start`` and can reach a terminal step (``succeed``, ``fail``, or any
   other non-choice step without ``next``) along those edges, the same
   inside every branch of a ``parallel`` or ``map`` step, expressions
   compile, durations parse, ``catch`` rules can match, and the ``input``
   schema is a valid draft 2020-12 schema whose ``default`` values fit it;
4. builds immutable `WorkflowDefinition` objects.

Step 2 words its errors with `toolkit.definition.schema_faults`, step 3 is
`toolkit.definition.semantic`, step 4 `toolkit.definition.build`.

Every fault of a file is collected and raised together as one
`DefinitionError`, each `DefinitionFault` naming the file, the line and the
JSON path (``$.steps.reserve.retry.max_attempts``).

The identity of a definition is ``(name, version, digest)``: the digest is the
SHA-256 of the canonical JSON of the document, so it does not depend on key
order, comments or YAML formatting.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

from toolkit.definition.build import _build
from toolkit.definition.json_schema import Draft202012Validator
from toolkit.definition.model import WorkflowDefinition
from toolkit.definition.paths import format_path
from toolkit.definition.schema_faults import schema_problems
from toolkit.definition.semantic import semantic_problems
from toolkit.definition.yaml_source import Problem, YamlSource, load_yaml, to_json
from toolkit.errors import DefinitionError, DefinitionFault

__all__ = [
    "definition_from_body",
    "load_definition",
    "load_definitions",
    "parse_definition",
    "schema_path",
]

_SCHEMA_FILE = "workflow.schema.json"


def schema_path() -> pathlib.Path:
    """Return the path of ``workflow.schema.json``.

    The wheel ships the schema inside the package (``toolkit/schemas/``); a source checkout
    has it in ``schemas/`` at the repository root, next to the package.
    """
    packaged = importlib.resources.files("toolkit") / "schemas" / _SCHEMA_FILE
    if packaged.is_file():
        return pathlib.Path(str(packaged))
    return pathlib.Path(__file__).resolve().parents[2] / "schemas" / _SCHEMA_FILE


@functools.cache
def _workflow_validator() -> Draft202012Validator:
    """The validator of the workflow schema, loaded once per process."""
    with schema_path().open(encoding="utf-8") as file:
        schema: dict[str, Any] = json.load(file)
    return Draft202012Validator(schema)


def parse_definition(text: str, *, source: str = "<string>") -> WorkflowDefinition:
    """Parse and validate a definition from YAML (or JSON) text.

    Args:
        text: The document.
        source: Name used for the file in faults and kept as the definition's ``source``.

    Raises:
        DefinitionError: With every fault found in the document.
    """
    return _parse(text, source)[0]


def load_definition(path: str | os.PathLike[str]) -> WorkflowDefinition:
    """Read, parse and validate a definition file.

    Raises:
        DefinitionError: With every fault of the file, or one fault naming the file when it
            cannot be read or is not UTF-8.
    """
    return _load(path)[0]


def load_definitions(
    paths: Iterable[str | os.PathLike[str]], *, accept_new_only: bool = False
) -> list[WorkflowDefinition]:
    """Load many definition files; a directory stands for its ``*.yaml`` / ``*.yml`` files.

    Directory entries are taken in sorted order (not recursively); a file given twice is
    loaded once. Two files declaring the same ``(name, version)`` is a fault.

    Args:
        paths: files and folders.
        accept_new_only: a definition whose only faults are those of checks made stricter
            for new registrations loads, carrying them (``new_only_faults``): a worker can
            run a version registered before the check (registering it anew is refused, see
            ``DefinitionCatalog.deploy``). Default: they are faults like any other.

    Returns:
        The definitions in load order.

    Raises:
        DefinitionError: With the faults of all files together (a folder without a
            definition file is one), and the definitions of the other files (``loaded``).
    """
    files: list[pathlib.Path] = []
    faults: list[DefinitionFault] = []
    for entry in map(pathlib.Path, paths):
        if entry.is_dir():
            found = sorted(
                p for p in entry.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()
            )
            if not found:
                faults.append(
                    DefinitionFault(str(entry), None, "$", "no *.yaml or *.yml file in this folder")
                )
            files += found
        else:
            files.append(entry)
    definitions: list[WorkflowDefinition] = []
    seen_files: set[str] = set()
    first_file: dict[tuple[str, int], str] = {}
    for file in files:
        real = os.path.realpath(file)
        if real in seen_files:
            continue
        seen_files.add(real)
        try:
            definition, yaml_source = _load(file, accept_new_only)
        except DefinitionError as exc:
            faults += exc.faults
            continue
        name_version = (definition.name, definition.version)
        if name_version in first_file:
            faults.append(
                DefinitionFault(
                    str(file),
                    yaml_source.line_of(("version",)) if yaml_source else None,
                    "$.version",
                    f"{definition.name} version {definition.version} is also defined in"
                    f" {first_file[name_version]}",
                )
            )
            continue
        first_file[name_version] = str(file)
        definitions.append(definition)
    if faults:
        raise DefinitionError(faults, loaded=definitions)
    return definitions


def definition_from_body(
    body: Mapping[str, Any], *, source: str | None = None
) -> WorkflowDefinition:
    """Rebuild a definition from its stored JSON body, with the same validation as YAML.

    Args:
        body: The ``body`` of a `WorkflowDefinition` (or any document in the format).
        source: Kept as the definition's ``source``; also names the file in faults
            (``<body>`` when None).

    Raises:
        DefinitionError: If the body is not a valid definition (faults have no line).
    """
    doc, problems = to_json(body)
    if problems:
        raise DefinitionError(_faults(problems, source or "<body>", None))
    return _check_and_build(doc, [], source or "<body>", None, source, registered=True)


def _load(
    path: str | os.PathLike[str], accept_new_only: bool = False
) -> tuple[WorkflowDefinition, YamlSource | None]:
    name = os.fspath(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        message = f"the file is not valid UTF-8 (byte {exc.start})"
        raise DefinitionError([DefinitionFault(name, None, "$", message)]) from exc
    except OSError as exc:
        message = f"cannot read the file: {exc.strerror or exc}"
        raise DefinitionError([DefinitionFault(name, None, "$", message)]) from exc
    return _parse(text, name, accept_new_only)


def _parse(
    text: str, source: str, accept_new_only: bool = False
) -> tuple[WorkflowDefinition, YamlSource | None]:
    yaml_source = load_yaml(text)
    problems = list(yaml_source.problems)
    if yaml_source.empty:
        problems.append(Problem((), "the document is empty", None))
    if yaml_source.empty or (yaml_source.data is None and problems):  # nothing to validate
        raise DefinitionError(_faults(problems, source, yaml_source))
    definition = _check_and_build(
        yaml_source.data, problems, source, yaml_source, source, accept_new_only=accept_new_only
    )
    return definition, yaml_source


def _check_and_build(
    doc: Any,
    problems: list[Problem],
    file: str,
    yaml_source: YamlSource | None,
    source: str | None,
    *,
    registered: bool = False,
    accept_new_only: bool = False,
) -> WorkflowDefinition:
    """Run schema and semantic checks on ``doc``; build the definition if nothing is wrong.

    ``registered``: the document is a stored body of a version already registered: the
    checks for new registrations only (``Problem.new_only``) are skipped. With
    ``accept_new_only``, a document whose only faults are such is built, carrying them.
    """
    lead, rest = schema_problems(doc, _workflow_validator())
    flagged = {p.path for p in lead + rest}
    semantic = [
        p for p in semantic_problems(doc, flagged)
        if p.path not in flagged and not (registered and p.new_only)
    ]  # fmt: skip
    line_of = yaml_source.line_of if yaml_source else (lambda path: None)
    ordered = (
        problems + lead + sorted(rest + semantic, key=lambda p: p.line or line_of(p.path) or 0)
    )
    if ordered and accept_new_only and all(problem.new_only for problem in ordered):
        deferred = tuple(_faults(ordered, file, yaml_source))
        return dataclasses.replace(_build(doc, source), new_only_faults=deferred)
    if ordered:
        raise DefinitionError(_faults(ordered, file, yaml_source))
    return _build(doc, source)


def _faults(
    problems: list[Problem], file: str, yaml_source: YamlSource | None
) -> list[DefinitionFault]:
    faults: list[DefinitionFault] = []
    for problem in problems:
        line = problem.line
        if line is None and yaml_source is not None and not yaml_source.empty:
            line = yaml_source.line_of(problem.path)
        fault = DefinitionFault(file, line, format_path(problem.path), problem.message)
        if fault not in faults:
            faults.append(fault)
    return faults
