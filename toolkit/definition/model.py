"""The model of a workflow definition: immutable steps and the validated definition.

Built by `toolkit.definition.build` from a document that passed every check (loading is
`toolkit.definition.load`); the failure rules steps hold are in
`toolkit.definition.policies`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from toolkit.definition.expressions import Template
from toolkit.definition.flow_control import Concurrency, Debounce, Throttle
from toolkit.definition.json_schema import Draft202012Validator
from toolkit.definition.payloads import _checked, input_validator
from toolkit.definition.policies import CatchRule, RetryPolicy
from toolkit.definition.schedules import ScheduleDeclaration
from toolkit.errors import DefinitionFault, ExpressionError, InputError

__all__ = [
    "DEFAULT_MAX_STEPS",
    "TIMEOUT_ERROR",
    "Branch",
    "BranchStep",
    "Callback",
    "ChoiceRule",
    "ChoiceStep",
    "Compensation",
    "EffectStep",
    "FailStep",
    "MapStep",
    "ParallelStep",
    "Reservation",
    "SetStep",
    "Step",
    "SucceedStep",
    "WaitEvent",
    "WaitStep",
    "WorkflowDefinition",
    "WorkflowStep",
]


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
    """Waits durably; exactly one of ``duration``, ``until``, ``signal`` and ``event`` is set.

    Attributes:
        id: Step id.
        duration: Seconds to wait (> 0), for a timer.
        until: For a wait until a moment: renders to an ISO-8601 timestamp with a UTC offset
            (checked at load time when constant; the engine checks rendered values).
        signal: Name of the signal to wait for.
        event: Name of the event to wait for (docs/events.md), with ``match``: payload
            field to the value it must equal, templates over the input.
        timeout: For a signal or event wait: seconds (> 0) after which the step fails with the error
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
    event: str | None = None
    match: Mapping[str, Template] | None = None

    @property
    def awaited(self) -> str | None:
        """The signal name the wait takes: its signal, or its event's (`event_signal`)."""
        return event_signal(self.event) if self.event is not None else self.signal


@dataclass(frozen=True)
class WaitEvent:
    """One event of ``wait: {any: [...]}``: a signal, an event, a duration or a moment.

    Exactly one of ``signal``, ``event``, ``duration`` and ``until`` is set.

    Attributes:
        signal: Signal name.
        duration: Seconds to wait (> 0).
        until: Renders to an ISO-8601 timestamp with a UTC offset.
        next: The step to go to when this event comes first.
        schema: JSON Schema of the signal's payload (signal events only), or None.
        event: Event name (docs/events.md), matched by ``match``.
        match: Payload field to the value it must equal, templates over the input.
    """

    signal: str | None
    duration: float | None
    until: Template | None
    next: str
    schema: Mapping[str, Any] | None = None
    event: str | None = None
    match: Mapping[str, Template] | None = None

    @property
    def awaited(self) -> str | None:
        """The signal name this event takes: its signal, or its event's (`event_signal`)."""
        return event_signal(self.event) if self.event is not None else self.signal


def event_signal(event: str) -> str:
    """The name under which event ``event`` is delivered to a task: a signal ``event:NAME``.

    No signal a user sends can have it (a signal name has no colon), so the two never mix.
    """
    return f"event:{event}"


@dataclass(frozen=True)
class Subscription:
    """A correlated wait of a definition: event ``event`` whose payload matches ``match``.

    Attributes:
        event: the event's name.
        match: payload field name to the value it must equal, a template over the input.
        cancels: the event cancels the task (``cancel_on``) rather than reaching a wait.
    """

    event: str
    match: Mapping[str, Template]
    cancels: bool = False


@dataclass(frozen=True)
class Trigger:
    """An event that starts a task of the definition (``triggers:``, docs/events.md).

    Attributes:
        event: the event's name.
        when: a template over ``event`` and ``context`` that must be truthy; None: always.
        input: the task input, a template over ``event`` and ``context``; None: the payload.
        key: the task's idempotency key, a template over ``event``; None: none.
    """

    event: str
    when: Template | None
    input: Template | None
    key: Template | None


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
class ItemSource:
    """Where a distributed map's items come from (``items_from``): pages of an effect, or a file.

    Exactly one of ``page`` and ``file`` is set.

    Attributes:
        page: The page source, an idempotent effect (its id is the map step's): called with
            its rendered ``args`` plus ``cursor`` (None for the first page), it returns
            ``{"items": [...], "cursor": next}``, a null ``cursor`` ending the list.
        file: Renders to the path of a JSON Lines file, one item per line.
        page_size: Lines of ``file`` listed per page.
    """

    page: EffectStep | None
    file: Template | None
    page_size: int = 1000


@dataclass(frozen=True)
class DistributedMapStep:
    """Runs items as child tasks of ``workflow`` across the fleet: ``map: {distributed: true}``.

    The items are listed page by page from ``items_from`` (never held all at once), each
    page's child tasks started as it is listed; the step then counts its children until none
    is live. Its output is a summary (``items``, ``tasks``, ``succeeded``, ``failed``,
    ``errors``: the first failed tasks); each child task keeps its own result
    (docs/composition.md#distributed-map).

    Attributes:
        id: Step id.
        items_from: Where the items come from.
        workflow: Name of the definition each child task runs.
        version: Its version; None resolves the latest submittable one when the step starts.
        input: Renders to a child's input (``context.item``, or ``context.items`` with
            ``items_per_task``, and ``context.index``); None: the item, or ``{"items":
            [...], "first_index": N}``.
        items_per_task: Items per child task; None: one item per task.
        max_concurrency: Most child tasks live at once (≥ 1), or None for no bound.
        tolerated_failures: Failed items the step tolerates, or None.
        tolerated_failure_percentage: Failed items tolerated as a percentage of all items,
            or None (neither set: none is tolerated; both: the smaller bound).
        next: The following step; None means the workflow succeeds with the summary.
        catch: Where to go when the step fails.
    """

    id: str
    items_from: ItemSource
    workflow: str
    version: int | None
    input: Template | None
    items_per_task: int | None
    max_concurrency: int | None
    tolerated_failures: int | None
    tolerated_failure_percentage: float | None
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
    | WorkflowStep | SetStep | DistributedMapStep
)
"""Any step of a definition."""

BranchStep = Step
"""A step inside a branch of a parallel or map step: any step (a parallel or map step
nested at most :data:`MAX_FANOUT_DEPTH` deep)."""

MAX_FANOUT_DEPTH = 3
"""How deep parallel and map steps may nest: a fan-out in a branch of a fan-out in a branch
of a top-level one (docs/composition.md, nested fan-out)."""


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
        new_only_faults: What checks made stricter for new registrations found (see
            ``load_definitions(accept_new_only=True)``): registering this version anew is
            refused; one registered before them keeps running.
        max_steps: Most steps a task may run (loops included) before it fails with
            ``MaxStepsExceeded``; default `DEFAULT_MAX_STEPS`.
        tags: The tags every task gets at submit, by key: templates over the input (see
            :meth:`task_tags`). Empty when the definition declares none.
        schedules: The schedules it declares (``schedules:``), which deploying it as the
            newest version makes, changes or removes (docs/schedules.md).
        triggers: The events that start a task of it (``triggers:``, docs/events.md).
        cancel_on: The events that cancel a task of it (``cancel_on:``).
        events: The payload schemas it declares, by event name (``events:``).
        concurrency: Its concurrency key (``concurrency:``, docs/flow-control.md), or None.
        priority: Its tasks' priority, 0 (lowest, the default) to 9 (``priority:``); a
            submit may override it (docs/flow-control.md#priority).
        debounce: Its debounce of submissions (``debounce:``), or None.
        throttle: Its throttle of task starts (``throttle:``), or None.
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
    tags: Mapping[str, Template] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    schedules: tuple[ScheduleDeclaration, ...] = ()
    triggers: tuple[Trigger, ...] = ()
    cancel_on: tuple[Subscription, ...] = ()
    events: Mapping[str, Mapping[str, Any]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    concurrency: Concurrency | None = None
    priority: int = 0
    debounce: Debounce | None = None
    throttle: Throttle | None = None
    new_only_faults: tuple[DefinitionFault, ...] = dataclasses.field(default=(), repr=False)

    @functools.cached_property
    def _input_validator(self) -> Draft202012Validator:
        return input_validator(self.input_schema)

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
        effects = [s for s in self.all_steps() if isinstance(s, EffectStep)]
        compensations = [s.compensate.handler for s in effects if s.compensate is not None]
        return frozenset([*(s.handler for s in effects), *compensations])

    def all_steps(self) -> list[Step]:
        """Every step of the definition: its own, then those of its branches, in order."""
        steps: list[Step] = list(self.steps.values())
        for step in steps:  # grows as it goes: the branches' steps, nested ones too
            if isinstance(step, ParallelStep):
                steps += [s for branch in step.branches.values() for s in branch.steps.values()]
            elif isinstance(step, MapStep):
                steps += step.branch.steps.values()
        return steps

    def subscriptions(self) -> list[Subscription]:
        """The correlated event waits of the definition (its branches' too) and ``cancel_on``.

        A task subscribes to them when it starts (docs/events.md), so that no event matching
        them emitted since is missed, whenever the task reaches the wait. Computed once per
        definition (every task's first cycle asks).
        """
        return list(self._subscriptions)

    @functools.cached_property
    def _subscriptions(self) -> tuple[Subscription, ...]:
        found: dict[tuple[str, tuple[tuple[str, str], ...]], Subscription] = {}
        for step in self.all_steps():
            if not isinstance(step, WaitStep):
                continue
            waits: list[WaitStep | WaitEvent] = [step, *step.any]
            for wait in waits:
                if wait.event is not None and wait.match is not None:
                    shape = tuple(sorted((k, repr(v)) for k, v in wait.match.items()))
                    found.setdefault((wait.event, shape), Subscription(wait.event, wait.match))
        return (*found.values(), *self.cancel_on)

    def task_tags(self, value: Any) -> dict[str, str]:
        """The tags the definition's ``tags`` give a task of input ``value``.

        A tag whose expression gives a string keeps it; a number or boolean becomes its
        JSON text (``42``, ``true``); null leaves the tag out.

        Raises:
            InputError: an expression fails, or gives an object or a list; ``path`` is
                ``$.tags.KEY``.
        """
        found: dict[str, str] = {}
        for key, template in self.tags.items():
            path = f"$.tags.{key}"
            try:
                rendered = template.render({"input": value, "steps": {}, "context": {}})
            except ExpressionError as exc:
                raise InputError(f"tag {key!r} of {self.name}: {exc}", path=path) from exc
            if rendered is None:
                continue
            if isinstance(rendered, dict | list):
                raise InputError(
                    f"tag {key!r} of {self.name}: {template.source!r} gives "
                    f"{type(rendered).__name__} {json.dumps(rendered)[:60]}, not a string",
                    path=path,
                )
            found[key] = rendered if isinstance(rendered, str) else json.dumps(rendered)
        return found

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
