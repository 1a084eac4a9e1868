"""Workflow definitions: load, validate, graph-check and digest them.

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

Every fault of a file is collected and raised together as one
`DefinitionError`, each `DefinitionFault` naming the file, the line and the
JSON path (``$.steps.reserve.retry.max_attempts``).

The identity of a definition is ``(name, version, digest)``: the digest is the
SHA-256 of the canonical JSON of the document, so it does not depend on key
order, comments or YAML formatting.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib.resources
import json
import os
import pathlib
import random
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from toolkit.definition import checks
from toolkit.definition.expressions import Template, compile_template
from toolkit.definition.paths import JsonPath, format_path
from toolkit.definition.yaml_source import Problem, YamlSource, load_yaml, to_json
from toolkit.durations import parse_duration
from toolkit.errors import DefinitionError, DefinitionFault, InputError

__all__ = [
    "DEFAULT_MAX_STEPS",
    "TIMEOUT_ERROR",
    "Branch",
    "BranchStep",
    "Callback",
    "CatchRule",
    "ChoiceRule",
    "ChoiceStep",
    "Compensation",
    "EffectStep",
    "FailStep",
    "MapStep",
    "ParallelStep",
    "Reservation",
    "RetryPolicy",
    "SetStep",
    "Step",
    "SucceedStep",
    "WaitEvent",
    "WaitStep",
    "WorkflowDefinition",
    "WorkflowStep",
    "catch_target",
    "definition_from_body",
    "load_definition",
    "load_definitions",
    "parse_definition",
    "schema_path",
    "validate_payload",
]

_SCHEMA_FILE = "workflow.schema.json"
_DEFAULT_RETRY: Mapping[str, Any] = types.MappingProxyType(
    {"max_attempts": 3, "initial": 1.0, "factor": 2.0, "max": 60.0, "jitter": True}
)


# --- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """When and how often a failed effect is attempted again.

    Attributes:
        max_attempts: Attempts in total, including the first (1 means no retry). An attempt
            lost to a crash or an expired lease counts too (docs/decisions.md). Default 3.
        initial: Delay before the first retry, in seconds.
        factor: Multiplier applied to the delay after each retry (≥ 1).
        max: Upper bound of any delay, in seconds.
        jitter: Whether delays are randomised (between 50% and 100% of the computed delay).
        non_retryable: Error names that fail the step at once, whatever the attempt count.
        errors: Error names this policy applies to (``"*"``: any), for a step whose ``retry``
            is a list of policies: the first policy naming an error decides; an error no
            policy names is not retried.
        unlimited: Retry without limit (``max_attempts: unlimited``); ``max_attempts`` is then
            the largest int and only lost attempts still count.
    """

    max_attempts: int = 3
    initial: float = 1.0
    factor: float = 2.0
    max: float = 60.0
    jitter: bool = True
    non_retryable: tuple[str, ...] = ()
    errors: tuple[str, ...] = ("*",)
    unlimited: bool = False

    def applies_to(self, error_name: str) -> bool:
        """Whether this policy covers the error named ``error_name``."""
        return ("*" in self.errors or error_name in self.errors) and (
            error_name not in self.non_retryable
        )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Return the delay, in seconds, before retrying after failed attempt number ``attempt``.

        The delay is ``min(max, initial * factor ** (attempt - 1))``; with jitter it is then
        scaled by a random factor between 0.5 and 1.0.

        Args:
            attempt: The 1-based number of the attempt that failed.
            rand: Source of uniform random numbers in ``[0, 1)``; pass a fixed function for
                deterministic tests.

        Raises:
            ValueError: If ``attempt`` is less than 1.
        """
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, got {attempt}")
        try:
            delay = min(self.max, self.initial * self.factor ** (attempt - 1))
        except OverflowError:
            delay = self.max
        if self.jitter:
            delay *= 0.5 + 0.5 * rand()
        return delay


@dataclass(frozen=True)
class CatchRule:
    """One rule of a step's ``catch``: go to ``next`` when the step fails with one of ``errors``.

    Attributes:
        errors: Error names; ``"*"`` stands for any error.
        next: The step to go to.
    """

    errors: tuple[str, ...]
    next: str

    def matches(self, error_name: str) -> bool:
        """Tell whether the rule catches the error named ``error_name``."""
        return "*" in self.errors or error_name in self.errors


def catch_target(rules: Sequence[CatchRule], error_name: str) -> str | None:
    """Return the ``next`` of the first rule catching ``error_name``, or None when none does."""
    for rule in rules:
        if rule.matches(error_name):
            return rule.next
    return None


@dataclass(frozen=True)
class EffectStep:
    """Calls the application handler registered under ``handler``.

    Attributes:
        id: Step id.
        handler: Registered handler name, e.g. ``inventory.reserve``.
        idempotent: Whether calling the handler again with the same arguments is safe. When a
            crash leaves an attempt's outcome unknown, an idempotent effect is called again; a
            non-idempotent one fails closed (the task waits for reconciliation).
        args: The handler's arguments (a constant None when the step has no ``args``).
        retry: Retry policy (step fields over ``defaults.retry`` over built-in defaults).
        timeout: Time limit of one attempt in seconds, or None for no limit.
        next: The following step; None means the workflow succeeds with this step's output.
        catch: Where to go when the step fails for good (retries exhausted, or a
            non-retryable error), tried in order (see `catch_target`); an error no rule
            catches fails the workflow.
    """

    id: str
    handler: str
    idempotent: bool
    args: Template
    retry: RetryPolicy
    timeout: float | None
    next: str | None
    catch: tuple[CatchRule, ...] = ()
    retry_rules: tuple[RetryPolicy, ...] = ()
    callback: Callback | None = None
    compensate: Compensation | None = None
    limits: tuple[str, ...] = ()

    def retry_policy(self, error_name: str) -> RetryPolicy | None:
        """The policy that retries the error named ``error_name``, or None (not retried).

        With a list of policies (``retry_rules``) the first that applies decides; else the
        single ``retry`` policy, unless the error is in its ``non_retryable``.
        """
        rules = self.retry_rules or (self.retry,)
        return next((rule for rule in rules if rule.applies_to(error_name)), None)


@dataclass(frozen=True)
class Callback:
    """An effect completed from outside: ``callback: {timeout}``.

    The handler gets a callback token (``ctx.callback_token``) to hand to an external
    system; the step completes when ``toolkit complete TOKEN`` (or `Tasks.complete`) is
    called with a result or an error.

    Attributes:
        timeout: Seconds to wait for the completion after the handler returns, or None for
            no limit; past it the attempt fails with ``Timeout``.
    """

    timeout: float | None


@dataclass(frozen=True)
class Compensation:
    """What undoes a completed effect when the task fails later: ``compensate: {effect, args}``.

    Attributes:
        handler: Registered handler name of the compensating effect.
        args: Its arguments, rendered when the step completes (``steps.<id>`` is its output).
        idempotent: Whether the compensation may be called again after a crash (default
            true); a non-idempotent one fails closed like any effect.
    """

    handler: str
    args: Template
    idempotent: bool = True


@dataclass(frozen=True)
class ChoiceRule:
    """One rule of a choice step: go to ``next`` when ``when`` is truthy (JMESPath truthiness)."""

    when: Template
    next: str


@dataclass(frozen=True)
class ChoiceStep:
    """Branches on the first matching rule, else ``default``.

    Attributes:
        id: Step id.
        choices: Rules, tried in order.
        default: Step to go to when no rule matches; when None, no match is a runtime error
            (`toolkit.errors.NoChoiceMatched`).
    """

    id: str
    choices: tuple[ChoiceRule, ...]
    default: str | None


@dataclass(frozen=True)
class SucceedStep:
    """Ends the workflow successfully with ``output`` (a constant None when absent)."""

    id: str
    output: Template


@dataclass(frozen=True)
class FailStep:
    """Ends the workflow with the error named ``error`` and a ``message`` (may be templated)."""

    id: str
    error: str
    message: Template
    compensate: bool = False


@dataclass(frozen=True)
class WaitStep:
    """Waits durably; exactly one of ``duration``, ``until`` and ``signal`` is set.

    Attributes:
        id: Step id.
        duration: Seconds to wait (> 0), for a timer.
        until: For a wait until a moment: renders to an ISO-8601 timestamp with a UTC offset
            (checked at load time when constant; the engine checks rendered values).
        signal: Name of the signal to wait for.
        timeout: For a signal wait: seconds (> 0) after which the step fails with the error
            ``Timeout`` (`TIMEOUT_ERROR`); None waits forever.
        next: The following step; None means the workflow succeeds with this step's output.
        catch: Where to go when the step fails: only a signal wait with a ``timeout`` can
            have rules, and they can only match ``Timeout`` (or ``*``).
    """

    id: str
    duration: float | None
    until: Template | None
    signal: str | None
    timeout: float | None
    next: str | None
    catch: tuple[CatchRule, ...] = ()
    any: tuple[WaitEvent, ...] = ()
    schema: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class WaitEvent:
    """One event of ``wait: {any: [...]}``: a signal, a duration or a moment, and where to go.

    Exactly one of ``signal``, ``duration`` and ``until`` is set.

    Attributes:
        signal: Signal name.
        duration: Seconds to wait (> 0).
        until: Renders to an ISO-8601 timestamp with a UTC offset.
        next: The step to go to when this event comes first.
        schema: JSON Schema of the signal's payload (signal events only), or None.
    """

    signal: str | None
    duration: float | None
    until: Template | None
    next: str
    schema: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class SetStep:
    """Computes and names values without calling a handler: ``set: {NAME: value, ...}``.

    The step's output is the object of rendered values (``steps.<id>.NAME``); it needs no
    write of its own.

    Attributes:
        id: Step id.
        values: Renders to the object of named values.
        next: The following step; None means the workflow succeeds with the values.
    """

    id: str
    values: Template
    next: str | None


DEFAULT_MAX_STEPS = 10_000
"""Steps a task may run by default before it fails with ``MaxStepsExceeded``."""

TIMEOUT_ERROR = "Timeout"
"""Error name of a signal wait whose ``timeout`` expires (and of an effect attempt time-out)."""

BranchStep = EffectStep | ChoiceStep | SucceedStep | FailStep | SetStep
"""A step allowed inside a branch of a parallel or map step."""


@dataclass(frozen=True)
class Branch:
    """A small graph run as one branch of a parallel or map step (DESIGN §2-3).

    Attributes:
        start: Id of the branch's first step.
        steps: The branch's steps by id (their own namespace): effect, choice, succeed and
            fail steps. The branch's output is the output of the step that ends it (a succeed
            step's output, or the result of an effect without ``next``); a fail step fails
            the branch.
    """

    start: str
    steps: Mapping[str, BranchStep]


@dataclass(frozen=True)
class Reservation:
    """Budget a parallel or map step reserves before any branch starts.

    Attributes:
        amounts: Resource name to amount (> 0), e.g. ``{"tokens": 2000}``.
        per_branch: The amounts are per branch (multiplied by the number of branches or
            items, and each branch may spend only its own share) rather than for the step.
    """

    amounts: Mapping[str, float]
    per_branch: bool


@dataclass(frozen=True)
class ParallelStep:
    """Runs named branches concurrently inside the task's lease.

    Attributes:
        id: Step id.
        mode: ``all``: every branch must succeed, the output is the map of branch outputs;
            ``first_success``: the first branch to succeed wins and its output is the step's.
        branches: The branches by name, in document order.
        cancel_losers: Whether branches still running once the step's outcome is decided
            (the losers of a race, the others after a failure) may be cancelled. False: they
            run to their end and their results are recorded but ignored.
        reserve: Budget to reserve before any branch starts, or None.
        next: The following step; None means the workflow succeeds with this step's output.
        catch: Where to go when the step fails.
    """

    id: str
    mode: Literal["all", "first_success"]
    branches: Mapping[str, Branch]
    cancel_losers: bool
    reserve: Reservation | None
    next: str | None
    catch: tuple[CatchRule, ...] = ()


@dataclass(frozen=True)
class MapStep:
    """Runs ``branch`` once per item of a list, at most ``max_concurrency`` at a time.

    Attributes:
        id: Step id.
        items: Renders to the list of items (``context.item`` / ``context.index`` in the
            branch).
        max_concurrency: Most items running at once (≥ 1), or None for no bound.
        branch: The graph run for each item.
        cancel_losers: Whether items still running after one failed may be cancelled.
        reserve: Budget to reserve before any item starts, or None.
        next: The following step; None means the workflow succeeds with this step's output
            (the list of item outputs, in item order).
        catch: Where to go when the step fails.
    """

    id: str
    items: Template
    max_concurrency: int | None
    branch: Branch
    cancel_losers: bool
    reserve: Reservation | None
    next: str | None
    catch: tuple[CatchRule, ...] = ()


@dataclass(frozen=True)
class WorkflowStep:
    """Starts a child task and waits for it without holding a lease.

    Attributes:
        id: Step id.
        workflow: Name of the child's definition.
        version: Its version; None resolves the latest submittable version when the child
            starts (and pins it).
        input: Renders to the child's input.
        next: The following step; None means the workflow succeeds with the child's result.
        catch: Where to go when the child fails or is cancelled.
    """

    id: str
    workflow: str
    version: int | None
    input: Template
    next: str | None
    catch: tuple[CatchRule, ...] = ()


Step = (
    EffectStep | ChoiceStep | SucceedStep | FailStep | WaitStep | ParallelStep | MapStep
    | WorkflowStep | SetStep
)
"""Any step of a definition."""


@dataclass(frozen=True, eq=False)
class WorkflowDefinition:
    """A validated, immutable workflow definition.

    Two definitions are equal when their `key` is equal.

    Attributes:
        name: Workflow name.
        version: Workflow version (≥ 1).
        description: Free text ("" when absent).
        input_schema: JSON Schema of the task input (``{}``, accepting anything, when absent).
        start: Id of the first step.
        steps: The steps by id, in document order (read-only mapping).
        body: The validated document as plain JSON: what the registry stores. Treat it as
            read-only.
        digest: SHA-256 hex digest of the canonical JSON of ``body``.
        source: The file the definition was loaded from, the ``source`` label given to
            `parse_definition`, or None.
        budget: The task budget by resource (``{"tokens": 10000}``); a submit may override
            it. Empty when the definition declares none.
        timeout: The workflow deadline, seconds from submission (a submit may override it),
            or None for none: at the deadline the task fails with ``Timeout`` (or goes to
            ``on_timeout``) whether it runs, waits or is queued.
        on_timeout: Step to go to at the deadline instead of failing, or None.
        max_steps: Most steps a task may run (loops included) before it fails with
            ``MaxStepsExceeded``; default `DEFAULT_MAX_STEPS`.
    """

    name: str
    version: int
    description: str
    input_schema: Mapping[str, Any]
    start: str
    steps: Mapping[str, Step]
    body: Mapping[str, Any]
    digest: str
    source: str | None = None
    budget: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    timeout: float | None = None
    on_timeout: str | None = None
    max_steps: int = DEFAULT_MAX_STEPS

    @functools.cached_property
    def _input_validator(self) -> Draft202012Validator:
        return checks.input_validator(self.input_schema)

    @property
    def key(self) -> tuple[str, int, str]:
        """The definition identity ``(name, version, digest)``."""
        return (self.name, self.version, self.digest)

    def handlers(self) -> frozenset[str]:
        """Return the names of all effect handlers the definition calls.

        That includes the effects inside the branches of parallel and map steps and the
        compensating effects (``compensate.effect``), not those of child workflows, which are
        definitions of their own.
        """
        steps: list[Step] = list(self.steps.values())
        for step in self.steps.values():
            if isinstance(step, ParallelStep):
                steps += [s for branch in step.branches.values() for s in branch.steps.values()]
            elif isinstance(step, MapStep):
                steps += step.branch.steps.values()
        effects = [s for s in steps if isinstance(s, EffectStep)]
        compensations = [s.compensate.handler for s in effects if s.compensate is not None]
        return frozenset([*(s.handler for s in effects), *compensations])

    def validate_input(self, value: Any) -> Any:
        """Check task input against the input schema and fill in its defaults.

        Defaults declared under ``properties`` (at the top level and in nested objects) are
        applied to absent properties before validation.

        Args:
            value: The task input (JSON data). Not modified.

        Returns:
            A copy of ``value`` with defaults applied.

        Raises:
            InputError: If the input does not match; ``path`` is the JSON path of the most
                relevant fault, and the message names it. Also for an input nested too
                deeply to validate (the store refuses deeper than 64 levels before this).
        """
        return _checked(
            self._input_validator, value, f"input for {self.name} v{self.version}"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkflowDefinition):
            return NotImplemented
        return self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def _repr_markdown_(self) -> str:
        """The graph as a Mermaid flowchart in Markdown (Jupyter and mkdocs render it)."""
        from toolkit.definition.diagram import markdown

        return markdown(self)

    def __repr__(self) -> str:
        return (
            f"WorkflowDefinition(name={self.name!r}, version={self.version}, "
            f"digest={self.digest[:12]!r}, steps={len(self.steps)})"
        )


def validate_payload(schema: Mapping[str, Any], value: Any, what: str) -> Any:
    """Check a JSON value against a JSON Schema (draft 2020-12) and fill in its defaults.

    Used for signal payloads (``wait: {signal, schema}``); the same rules as task input.

    Args:
        schema: The schema.
        value: The value (JSON data). Not modified.
        what: Names the value in the error, e.g. ``"payload of signal 'approved'"``.

    Returns:
        A copy of ``value`` with defaults applied.

    Raises:
        InputError: The value does not match; ``path`` is the JSON path of the most relevant
            fault, and the message names it.
    """
    return _checked(checks.input_validator(schema), value, what)


def _checked(validator: Draft202012Validator, value: Any, what: str) -> Any:
    """``value`` with the defaults of the validator's schema applied, once it is valid.

    Raises:
        InputError: ``invalid WHAT: PATH: message`` for the most relevant fault.
    """
    try:
        filled = _apply_defaults(validator.schema, copy.deepcopy(value))
        error = best_match(validator.iter_errors(filled))
    except RecursionError:
        raise InputError(f"invalid {what}: $: nested too deeply to validate", path="$") from None
    if error is not None:
        message = checks.payload_fault(error)
        raise InputError(f"invalid {what}: {error.json_path}: {message}", path=error.json_path)
    return filled


def _apply_defaults(schema: Any, value: Any) -> Any:
    """Set absent properties that declare a ``default`` (recursively into objects)."""
    if not isinstance(schema, Mapping) or not isinstance(value, dict):
        return value
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return value
    for name, subschema in properties.items():
        if not isinstance(subschema, Mapping):
            continue
        if name not in value and "default" in subschema:
            value[name] = copy.deepcopy(subschema["default"])
        if name in value:
            value[name] = _apply_defaults(subschema, value[name])
    return value


# --- the schema -------------------------------------------------------------------------------


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


# --- loading ----------------------------------------------------------------------------------


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


def load_definitions(paths: Iterable[str | os.PathLike[str]]) -> list[WorkflowDefinition]:
    """Load many definition files; a directory stands for its ``*.yaml`` / ``*.yml`` files.

    Directory entries are taken in sorted order (not recursively); a file given twice is
    loaded once. Two files declaring the same ``(name, version)`` is a fault.

    Returns:
        The definitions in load order.

    Raises:
        DefinitionError: With the faults of all files together (a folder without a
            definition file is one).
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
            definition, yaml_source = _load(file)
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
        raise DefinitionError(faults)
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
    return _check_and_build(doc, [], source or "<body>", None, source)


def _load(path: str | os.PathLike[str]) -> tuple[WorkflowDefinition, YamlSource | None]:
    name = os.fspath(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        message = f"the file is not valid UTF-8 (byte {exc.start})"
        raise DefinitionError([DefinitionFault(name, None, "$", message)]) from exc
    except OSError as exc:
        message = f"cannot read the file: {exc.strerror or exc}"
        raise DefinitionError([DefinitionFault(name, None, "$", message)]) from exc
    return _parse(text, name)


def _parse(text: str, source: str) -> tuple[WorkflowDefinition, YamlSource | None]:
    yaml_source = load_yaml(text)
    problems = list(yaml_source.problems)
    if yaml_source.empty:
        problems.append(Problem((), "the document is empty", None))
    if yaml_source.empty or (yaml_source.data is None and problems):  # nothing to validate
        raise DefinitionError(_faults(problems, source, yaml_source))
    definition = _check_and_build(yaml_source.data, problems, source, yaml_source, source)
    return definition, yaml_source


def _check_and_build(
    doc: Any,
    problems: list[Problem],
    file: str,
    yaml_source: YamlSource | None,
    source: str | None,
) -> WorkflowDefinition:
    """Run schema and semantic checks on ``doc``; build the definition if nothing is wrong."""
    lead, rest = checks.schema_problems(doc, _workflow_validator())
    flagged = {p.path for p in lead + rest}
    semantic = [p for p in checks.semantic_problems(doc, flagged) if p.path not in flagged]
    line_of = yaml_source.line_of if yaml_source else (lambda path: None)
    ordered = (
        problems + lead + sorted(rest + semantic, key=lambda p: p.line or line_of(p.path) or 0)
    )
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


# --- building ---------------------------------------------------------------------------------


def _build(doc: dict[str, Any], source: str | None) -> WorkflowDefinition:
    """Build the model from a document that passed every check."""
    defaults = doc.get("defaults", {})
    steps = {
        step_id: _build_step(("steps", step_id), raw, defaults)
        for step_id, raw in doc["steps"].items()
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return WorkflowDefinition(
        name=doc["name"],
        version=int(doc["version"]),
        description=doc.get("description", ""),
        input_schema=_input_schema(doc.get("input", True)),
        start=doc["start"],
        steps=types.MappingProxyType(steps),
        body=doc,
        digest=hashlib.sha256(canonical.encode()).hexdigest(),
        source=source,
        budget=_amounts(doc.get("budget", {})),
        timeout=parse_duration(doc["timeout"]) if "timeout" in doc else None,
        on_timeout=doc.get("on_timeout"),
        max_steps=int(doc.get("max_steps", DEFAULT_MAX_STEPS)),
    )


def _input_schema(schema: Mapping[str, Any] | bool) -> Mapping[str, Any]:
    """Normalise a boolean input schema to the equivalent object schema."""
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    return schema


def _build_step(where: JsonPath, raw: dict[str, Any], defaults: dict[str, Any]) -> Step:
    """Build the step at ``where`` (its path; the last part is its id)."""
    step_id, path = str(where[-1]), format_path(where)
    if "parallel" in raw:
        parallel = raw["parallel"]
        return ParallelStep(
            id=step_id,
            mode=parallel.get("mode", "all"),
            branches=types.MappingProxyType(
                {
                    name: _build_branch((*where, "parallel", "branches", name), branch, defaults)
                    for name, branch in parallel["branches"].items()
                }
            ),
            cancel_losers=bool(parallel.get("cancel_losers", False)),
            reserve=_reservation(parallel.get("reserve")),
            next=raw.get("next"),
            catch=_catch_rules(raw),
        )
    if "map" in raw:
        mapped = raw["map"]
        return MapStep(
            id=step_id,
            items=compile_template(mapped["items"], path=f"{path}.map.items"),
            max_concurrency=mapped.get("max_concurrency"),
            branch=_build_branch((*where, "map", "branch"), mapped["branch"], defaults),
            cancel_losers=bool(mapped.get("cancel_losers", False)),
            reserve=_reservation(mapped.get("reserve")),
            next=raw.get("next"),
            catch=_catch_rules(raw),
        )
    if "workflow" in raw:
        child = raw["workflow"]
        return WorkflowStep(
            id=step_id,
            workflow=child["name"],
            version=child.get("version"),
            input=compile_template(child.get("input"), path=f"{path}.workflow.input"),
            next=raw.get("next"),
            catch=_catch_rules(raw),
        )
    if "wait" in raw:
        wait = raw["wait"]
        events = tuple(
            _wait_event(f"{path}.wait.any[{i}]", event)
            for i, event in enumerate(wait.get("any", ()))
        )
        return WaitStep(
            id=step_id,
            duration=parse_duration(wait["duration"]) if "duration" in wait else None,
            until=_until(wait, f"{path}.wait"),
            signal=wait.get("signal"),
            timeout=parse_duration(wait["timeout"]) if "timeout" in wait else None,
            next=raw.get("next"),
            catch=_catch_rules(raw),
            any=events,
            schema=wait.get("schema"),
        )
    return _build_branch_step(where, raw, defaults)


def _wait_event(path: str, raw: Mapping[str, Any]) -> WaitEvent:
    """Build one event of ``wait.any`` (``path``: its JSON path)."""
    return WaitEvent(
        signal=raw.get("signal"),
        duration=parse_duration(raw["duration"]) if "duration" in raw else None,
        until=_until(raw, path),
        next=raw["next"],
        schema=raw.get("schema"),
    )


def _until(raw: Mapping[str, Any], path: str) -> Template | None:
    """The compiled ``until`` of a wait or wait event at ``path``, or None."""
    until = raw.get("until")
    return None if until is None else compile_template(until, path=f"{path}.until")


def _build_branch_step(
    where: JsonPath, raw: dict[str, Any], defaults: dict[str, Any]
) -> BranchStep:
    """Build an effect, choice, succeed, fail or set step (the kinds a branch may hold)."""
    step_id, path = str(where[-1]), format_path(where)
    if "effect" in raw:
        timeout = raw.get("timeout", defaults.get("timeout"))
        retry, retry_rules = _retry(raw.get("retry", {}), defaults.get("retry", {}))
        callback = raw.get("callback")
        compensate = raw.get("compensate")
        return EffectStep(
            id=step_id,
            handler=raw["effect"],
            idempotent=raw["idempotent"],
            args=compile_template(raw.get("args"), path=f"{path}.args"),
            retry=retry,
            timeout=None if timeout is None else parse_duration(timeout),
            next=raw.get("next"),
            catch=_catch_rules(raw),
            retry_rules=retry_rules,
            callback=None
            if callback is None
            else Callback(
                timeout=parse_duration(callback["timeout"]) if "timeout" in callback else None
            ),
            compensate=None
            if compensate is None
            else Compensation(
                handler=compensate["effect"],
                args=compile_template(compensate.get("args"), path=f"{path}.compensate.args"),
                idempotent=bool(compensate.get("idempotent", True)),
            ),
            limits=tuple(raw.get("limits", ())),
        )
    if "set" in raw:
        return SetStep(
            id=step_id,
            values=compile_template(raw["set"], path=f"{path}.set"),
            next=raw.get("next"),
        )
    if "choice" in raw:
        rules = tuple(
            ChoiceRule(
                when=compile_template(rule["when"], path=f"{path}.choice[{i}].when"),
                next=rule["next"],
            )
            for i, rule in enumerate(raw["choice"])
        )
        return ChoiceStep(id=step_id, choices=rules, default=raw.get("default"))
    if "succeed" in raw:
        output = raw["succeed"].get("output")
        return SucceedStep(
            id=step_id, output=compile_template(output, path=f"{path}.succeed.output")
        )
    fail = raw["fail"]
    message = compile_template(fail.get("message", ""), path=f"{path}.fail.message")
    return FailStep(
        id=step_id,
        error=fail["error"],
        message=message,
        compensate=bool(fail.get("compensate", False)),
    )


def _build_branch(where: JsonPath, raw: dict[str, Any], defaults: dict[str, Any]) -> Branch:
    """Build the branch at ``where``; the definition's effect defaults apply inside it too."""
    steps = {
        step_id: _build_branch_step((*where, "steps", step_id), step, defaults)
        for step_id, step in raw["steps"].items()
    }
    return Branch(start=raw["start"], steps=types.MappingProxyType(steps))


def _reservation(raw: Mapping[str, Any] | None) -> Reservation | None:
    if raw is None:
        return None
    per_branch = "per_branch" in raw
    return Reservation(
        amounts=_amounts(raw["per_branch" if per_branch else "total"]), per_branch=per_branch
    )


def _amounts(raw: Mapping[str, Any]) -> Mapping[str, float]:
    return types.MappingProxyType({name: float(amount) for name, amount in raw.items()})


def _catch_rules(raw: Mapping[str, Any]) -> tuple[CatchRule, ...]:
    return tuple(
        CatchRule(errors=tuple(rule["errors"]), next=rule["next"]) for rule in raw.get("catch", ())
    )


def _retry(
    raw: Mapping[str, Any] | Sequence[Mapping[str, Any]], defaults: Mapping[str, Any]
) -> tuple[RetryPolicy, tuple[RetryPolicy, ...]]:
    """An effect's ``(retry, retry_rules)`` from its ``retry`` and ``defaults.retry``.

    A single policy gives no rules. A list of policies gives one rule per policy (fields each
    policy leaves out come from the defaults), and as ``retry`` the first rule for any error
    (``"*"``), else the defaults with the largest ``max_attempts`` of the rules: the policy
    lost attempts count against.
    """
    if isinstance(raw, Mapping):
        return _retry_policy({**_DEFAULT_RETRY, **defaults, **raw}), ()
    rules = tuple(_retry_policy({**_DEFAULT_RETRY, **defaults, **rule}) for rule in raw)
    catch_all = next((rule for rule in rules if "*" in rule.errors), None)
    if catch_all is not None:
        return catch_all, rules
    fallback = _retry_policy({**_DEFAULT_RETRY, **defaults})
    most = max(rules, key=lambda rule: rule.max_attempts)
    return (
        dataclasses.replace(fallback, max_attempts=most.max_attempts, unlimited=most.unlimited),
        rules,
    )


def _retry_policy(fields: Mapping[str, Any]) -> RetryPolicy:
    unlimited = fields["max_attempts"] == "unlimited"
    return RetryPolicy(
        max_attempts=sys.maxsize if unlimited else int(fields["max_attempts"]),
        initial=parse_duration(fields["initial"]),
        factor=float(fields["factor"]),
        max=parse_duration(fields["max"]),
        jitter=bool(fields["jitter"]),
        non_retryable=tuple(fields.get("non_retryable", ())),
        errors=tuple(fields.get("errors", ("*",))),
        unlimited=unlimited,
    )
