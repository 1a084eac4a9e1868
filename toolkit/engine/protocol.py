"""The transition protocol: each step kind returns what happened, one loop applies it.

A step kind (one module each under ``toolkit.engine.steps``) gets a :class:`StepContext`
and returns a :data:`Transition`: the step finished with an output (:class:`Advance`), went
elsewhere (:class:`Goto`), ended the graph (:class:`Finish`), failed for good
(:class:`Failed`), has to wait for something (:class:`Wait`), is to be tried again later
(:class:`Retry`) or has an outcome only an operator can tell (:class:`Reconcile`). It never
decides what that means for the task: a :class:`Level` does. The task's own graph makes a
wait durable and releases its lease; a branch of a parallel or map step parks (its own row
records the wait) and the task waits once every live branch does. :func:`run_graph` is the
one loop both levels run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from toolkit import faults, tracing
from toolkit.application import SpendLimits
from toolkit.checkpoint import Frame
from toolkit.definition import Step
from toolkit.engine.cycle import Cycle, CycleOutcome
from toolkit.engine.failures import Error
from toolkit.lifecycle import WaitReason
from toolkit.store.writes import Event
from toolkit.waits import Wait as WaitState

# --- what a step came to --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Advance:
    """The step finished with ``output``; go to ``next`` (None: the graph ends with it)."""

    output: Any
    next: str | None


@dataclasses.dataclass(frozen=True)
class Goto:
    """Go to ``target``, recording nothing (a choice)."""

    target: str


@dataclasses.dataclass(frozen=True)
class Finish:
    """The graph ends with ``output`` (a succeed step)."""

    output: Any


@dataclasses.dataclass(frozen=True)
class Failed:
    """The step failed for good with ``error``: its ``catch`` decides, else the graph fails.

    ``compensate`` is False for a ``fail`` step without ``compensate: true``: the task then
    fails without running the compensations of its completed effects.
    """

    error: Error
    compensate: bool = True


@dataclasses.dataclass(frozen=True)
class Wait:
    """The step waits for something.

    ``wait`` is what (stored in the checkpoint), ``event`` records it, and the wait ends at
    ``run_at`` (ISO-8601, database time) or after ``delay_seconds`` at the latest, whichever
    is given (``run_at`` first).
    """

    reason: WaitReason
    wait: WaitState
    event: Event
    run_at: str | None = None
    delay_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class Retry:
    """Attempt ``attempt`` at ``occurrence`` failed with ``error``: try again in ``delay`` s."""

    occurrence: str
    attempt: int
    error: Error | None
    delay: float


@dataclasses.dataclass(frozen=True)
class Reconcile:
    """The outcome of ``occurrence``'s recorded intent is unknown: fail closed.

    Its effect is not idempotent, so the task waits until an operator records the outcome
    (``error``: why it is unknown, when a timeout made it so).
    """

    occurrence: str
    error: Error | None = None


Transition = Advance | Goto | Finish | Failed | Wait | Retry | Reconcile


# --- where a step runs ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spend:
    """How the effects of a frame spend budgeted resources.

    ``limits``: what they may still spend, read at each report; ``charge``: where a call's
    spend goes.
    """

    limits: Callable[[], SpendLimits]
    charge: Callable[[dict[str, float]], None]


@dataclasses.dataclass(frozen=True)
class StepKind:
    """How one kind of step runs.

    ``run`` returns its transition; ``taken_over``, for a kind whose step may have been in
    progress when a previous lease lapsed, says what that lost attempt means (None: go on).
    ``pure`` marks a kind that calls no handler and needs no write of its own (``choice``,
    ``set``, ``succeed``, ``fail``; DESIGN §4): a run of such steps is paced
    (:meth:`Cycle.pace`), and leases that lapse at one are counted (a step that stalls or
    crashes its worker ends its task, `TaskGraph`).
    """

    run: Callable[[StepContext, Any], Awaitable[Transition]]
    taken_over: Callable[[StepContext, Any], Transition | None] | None = None
    pure: bool = False


Kinds = Mapping[type, StepKind]


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What a step runs with.

    Attributes:
        cycle: the cycle (task, lease, checkpoint, pending writes, store).
        frame: the graph it runs in: the task's checkpoint or a branch's frame.
        scope: the expression scope at this step.
        spend: how its effects spend.
        kinds: every step kind (a parallel or map step runs its branches' steps with them).
        address: in a branch, its name (signals addressed to it are its own); None at the
            task's level.
    """

    cycle: Cycle
    frame: Frame
    scope: dict[str, Any]
    spend: Spend
    kinds: Kinds
    address: str | None = None


class Level(Protocol):
    """A graph being run: the task's own, or a branch of a parallel or map step."""

    @property
    def frame(self) -> Frame:
        """The graph's progress."""

    def running(self) -> bool:
        """Whether the graph has a step to run next."""

    def steps(self) -> Mapping[str, Step]:
        """The graph's steps by id."""

    def context(self, step: Step) -> StepContext:
        """What ``step`` runs with."""

    async def before(self, step: Step) -> CycleOutcome | None:
        """Anything to do before ``step`` runs; an outcome ends the cycle instead."""

    async def apply(self, step: Step, transition: Transition) -> CycleOutcome | None:
        """Carry out what ``step`` came to; an outcome ends the cycle."""


async def run_graph(level: Level) -> CycleOutcome | None:
    """The one loop: run a graph's steps, applying what each came to, until it stops.

    Returns:
        The outcome a level's ``before`` or ``apply`` ended the cycle with, or None once the
        graph has nothing more to run (a branch that ended or blocked).
    """
    steps = level.steps()
    while level.running():
        frame_cursor = level.frame.cursor
        assert frame_cursor is not None
        step = steps[frame_cursor]
        outcome = await level.before(step)
        if outcome is not None:
            return outcome
        if not level.running():  # ``before`` ended the graph (a branch past max_steps)
            continue
        ctx = level.context(step)
        kind = ctx.kinds[type(step)]
        if kind.pure:
            await ctx.cycle.pace()
            if faults.ARMED:
                faults.fault_point(faults.PURE_STEP, step.id)
        else:
            ctx.cycle.unpaced()
        attributes = functools.partial(_step_attributes, ctx, step)
        with tracing.span(f"step {step.id}", attributes) as span:
            transition = await kind.run(ctx, step)
            _traced(span, transition)
            outcome = await level.apply(step, transition)
        if outcome is not None:
            return outcome
    return None


def _step_attributes(ctx: StepContext, step: Step) -> tracing.Attributes:
    """The attributes of a step's span (docs/tracing.md): its kind adds its own."""
    attributes: dict[str, str | int | float | bool] = {
        "task.id": ctx.cycle.task.id,
        "step.name": step.id,
        "step.kind": type(step).__name__.removesuffix("Step").lower(),
        "step.occurrence": ctx.frame.occurrence(step.id),
    }
    if ctx.address is not None:
        attributes["branch"] = ctx.address
    return attributes


#: What a step came to, as its span's ``runifold.outcome``.
_OUTCOMES: Mapping[type, str] = {
    Advance: "completed", Goto: "moved", Finish: "finished", Failed: "failed",
    Wait: "waiting", Retry: "retrying", Reconcile: "reconciliation",
}  # fmt: skip


def _traced(span: tracing.Span, transition: Transition) -> None:
    """Record on ``span`` what its step came to."""
    error = getattr(transition, "error", None)
    message = str(error.get("message") or error.get("name")) if error else None
    span.outcome(_OUTCOMES[type(transition)], message)
    if isinstance(transition, Wait):
        span.set("wait.reason", str(transition.reason))
