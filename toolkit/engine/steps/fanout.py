"""``parallel`` and ``map``: branches run concurrently inside the task's lease.

Each branch's progress is committed as it happens (its frame is in the checkpoint), so a
crash resumes every branch where it was and never re-runs a finished one. A race winner is
committed before anything else happens. Reservations are taken before any branch starts and
released when the step ends. A branch runs its steps through the same loop as the task
(:func:`~toolkit.engine.protocol.run_graph`); :class:`BranchLevel` says what their
transitions mean inside a branch, which shares the task's lease with its siblings.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from typing import Any

import anyio

from toolkit.application import SpendLimits
from toolkit.checkpoint import BranchFrame, BranchStatus, CallbackWait, FanOut
from toolkit.definition import Branch, EffectStep, MapStep, ParallelStep, Step, catch_target
from toolkit.definition.wording import json_type
from toolkit.engine.cycle import CycleOutcome
from toolkit.engine.failures import Error
from toolkit.engine.protocol import (
    Advance,
    Failed,
    Finish,
    Goto,
    Reconcile,
    Retry,
    Spend,
    StepContext,
    StepKind,
    Transition,
    Wait,
    run_graph,
)
from toolkit.engine.reservations import release, reserve
from toolkit.errors import ExpressionError
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.store.writes import Event

#: Pause between two looks at a callback awaited inside a branch (which keeps its lease), s.
CALLBACK_POLL = 0.5
#: Longest pause of a branch whose effect waits for a downstream limit before it looks
#: again, seconds (a branch keeps the task's lease, so no released slot can wake it).
LIMIT_BRANCH_RECHECK = 1.0


async def run(ctx: StepContext, step: ParallelStep | MapStep) -> Transition:
    """Run the step's branches (reserving first), and say what they came to.

    Raises:
        ExpressionError: a map's ``items`` is not a list.
    """
    cycle = ctx.cycle
    cp = cycle.checkpoint
    occurrence = ctx.frame.occurrence(step.id)
    items: list[Any] | None = None
    if isinstance(step, MapStep):
        rendered = step.items.render(ctx.scope)
        if not isinstance(rendered, list):
            raise ExpressionError(
                f"step {step.id!r}: map items must be a list, got {json_type(rendered)}",
                step=step.id,
            )
        items = rendered
        names = [str(index) for index in range(len(items))]
    else:
        names = list(step.branches)
    fan = cp.fanout
    if fan is None or fan.occurrence != occurrence:
        fan = FanOut(occurrence)
        cp.fanout = fan
        cycle.events.append(
            Event(EventKind.FANOUT_STARTED, {"step": step.id, "branches": len(names)})
        )
    if step.reserve is not None and fan.reserved is None:
        refused = await reserve(cycle, step, fan, len(names))
        if refused is not None:
            return refused
    branches = Branches(ctx, step, fan, names, items)
    await branches.resume()
    cycle.fanning_out = True
    try:
        await branches.run()
    finally:
        cycle.fanning_out = False
    return branches.end()


class Branches:
    """The branches of one parallel or map step occurrence, run inside one cycle."""

    def __init__(
        self,
        ctx: StepContext,
        step: ParallelStep | MapStep,
        fan: FanOut,
        names: list[str],
        items: list[Any] | None,
    ) -> None:
        self.cycle = ctx.cycle
        self.kinds = ctx.kinds
        self.step = step
        self.fan = fan
        self.names = names
        self.items = items
        #: (branch, error) of the first branch that failed (mode ``all`` and map).
        self.failure: tuple[str, Error] | None = None
        self.scope = anyio.CancelScope()
        #: Event-loop time each awaited callback began to be awaited, by token (one per
        #: attempt, so each attempt waits its whole timeout).
        self.callbacks_since: dict[str, float] = {}
        reserve = step.reserve
        self.reserved: Mapping[str, float] = reserve.amounts if reserve is not None else {}
        self.per_branch = reserve is not None and reserve.per_branch

    def branch(self, name: str) -> Branch:
        """The graph of branch ``name``."""
        step = self.step
        return step.branch if isinstance(step, MapStep) else step.branches[name]

    @property
    def racing(self) -> bool:
        """Whether the first branch to succeed decides (``mode: first_success``)."""
        return isinstance(self.step, ParallelStep) and self.step.mode == "first_success"

    def level(self, name: str, frame: BranchFrame) -> BranchLevel:
        """The level branch ``name`` runs at."""
        return BranchLevel(self, name, frame)

    async def resume(self) -> None:
        """Bring stored branches back: apply a takeover's lost attempts, unblock resolved ones."""
        cp = self.cycle.checkpoint
        if cp.pending is not None and cp.pending.startswith(f"{self.fan.occurrence}/"):
            cp.pending = None  # the blocked branch keeps its own pending occurrence
        for name, frame in self.fan.branches.items():
            if frame.status is BranchStatus.BLOCKED:
                frame.status = BranchStatus.RUNNING  # its effect finds the resolution, or blocks
            if (
                frame.status is not BranchStatus.RUNNING
                or not self.cycle.task.recovered
                or frame.cursor is None
            ):
                continue
            inner = self.branch(name).steps[frame.cursor]
            taken_over = self.kinds[type(inner)].taken_over
            if taken_over is None:
                continue
            level = self.level(name, frame)
            transition = taken_over(level.context(inner), inner)
            if transition is not None:
                await level.apply(inner, transition)

    async def run(self) -> None:
        """Run every branch not ended, at most ``max_concurrency`` of a map's at once."""
        step = self.step
        limit = step.max_concurrency if isinstance(step, MapStep) else None
        slots = anyio.Semaphore(limit) if limit else None
        for name, frame in self.fan.branches.items():
            if frame.status is BranchStatus.FAILED and self.failure is None and not self.racing:
                self.failure = (name, frame.error or {})
        try:
            with self.scope:
                async with anyio.create_task_group() as group:
                    for name in self.names:
                        group.start_soon(self._run_one, name, slots)
        except BaseExceptionGroup as group_error:
            raise first_error(group_error) from None

    async def _run_one(self, name: str, slots: anyio.Semaphore | None) -> None:
        if slots is None:
            await self._run_branch(name)
            return
        async with slots:
            await self._run_branch(name)

    async def _run_branch(self, name: str) -> None:
        frame = self.fan.branches.get(name)
        if frame is None:
            if self.failure is not None:
                return  # a map item not started once the step has failed: never started
            frame = BranchFrame.start(self.branch(name).start, f"{self.fan.occurrence}/{name}/")
            self.fan.branches[name] = frame
        if frame.status is not BranchStatus.RUNNING:
            return
        await run_graph(self.level(name, frame))
        await self.cycle.commit()  # the branch's end is durable as it happens
        await self._ended(name, frame)

    async def _ended(self, name: str, frame: BranchFrame) -> None:
        """Decide what a branch's end means for the step."""
        step = self.step
        if self.racing and frame.status is BranchStatus.SUCCEEDED and self.fan.winner is None:
            self.fan.winner = name
            self.cycle.events.append(Event(EventKind.RACE_WON, {"step": step.id, "branch": name}))
            await self.cycle.commit()  # the winner is durable before all else
            if step.cancel_losers:
                self.scope.cancel()
        elif not self.racing and frame.status is BranchStatus.FAILED and self.failure is None:
            self.failure = (name, frame.error or {})
            if step.cancel_losers:
                self.scope.cancel()

    def end(self) -> Transition:
        """What the step came to once its branches stopped."""
        cycle, step, fan = self.cycle, self.step, self.fan
        branches = fan.branches
        for name, frame in branches.items():
            if frame.status is BranchStatus.RUNNING:  # stopped by cancel_losers
                frame.status = BranchStatus.CANCELLED
                cycle.events.append(
                    Event(EventKind.BRANCH_CANCELLED, {"step": step.id, "branch": name,
                                                       "pending": frame.pending})
                )  # fmt: skip
        winner = fan.winner
        blocked = [frame for frame in branches.values() if frame.status is BranchStatus.BLOCKED]
        output: Any = None
        error: Error | None = None
        if self.racing and winner is not None:
            output = branches[winner].output
        elif not self.racing and self.failure is not None:
            name, branch_error = self.failure
            error = {**branch_error, "branch": name}
        elif blocked:  # undecided while an effect's outcome is unknown: reconcile first
            pending = blocked[0].pending
            assert pending is not None
            return Reconcile(pending)
        elif self.racing:
            errors = {name: frame.error for name, frame in branches.items()}
            error = {"name": "AllBranchesFailed", "errors": errors,
                     "message": f"every branch of step {step.id!r} failed"}  # fmt: skip
        else:
            outputs = [branches[name].output for name in self.names]
            mapped = isinstance(step, MapStep)
            output = outputs if mapped else dict(zip(self.names, outputs, strict=True))
        release(cycle, fan)
        cycle.checkpoint.fanout = None
        detail: dict[str, Any] = {"step": step.id, "outcome": "failed" if error else "succeeded"}
        if winner is not None:
            detail["winner"] = winner
        cycle.events.append(Event(EventKind.FANOUT_ENDED, detail))
        if error is not None:
            return Failed(error)
        cycle.check_result(output, step.id, "the branches")
        return Advance(output, step.next)

    def context(self, name: str) -> dict[str, Any]:
        """What ``context`` adds in branch ``name``: its name (a map's item and index too)."""
        if self.items is None:
            return {"branch": name}
        index = int(name)
        return {"branch": name, "index": index, "item": self.items[index]}

    def spend_limits(self, frame: BranchFrame) -> SpendLimits:
        """What an effect of ``frame`` may spend: its reservation's rest, else the task's."""
        limits: dict[str, tuple[Hashable, float]] = dict(self.cycle.spend_limits())
        for resource, amount in self.reserved.items():
            if self.per_branch:
                share = amount - frame.spent.get(resource, 0.0)
                limits[resource] = (("branch", id(frame), resource), share)
            else:
                assert self.fan.reserved is not None
                rest = self.fan.reserved[resource] - self.fan.spent.get(resource, 0.0)
                limits[resource] = (("reservation", resource), rest)
        return limits

    def charge(self, frame: BranchFrame, spend: dict[str, float]) -> None:
        """Charge a branch's spend: to the reservation when it covers the resource."""
        outside = {}
        for resource, amount in spend.items():
            frame.spent[resource] = frame.spent.get(resource, 0.0) + amount
            if resource in self.reserved:
                self.fan.spent[resource] = self.fan.spent.get(resource, 0.0) + amount
            else:
                outside[resource] = amount
        if outside:
            self.cycle.charge(outside)


class BranchLevel:
    """One branch's graph: its steps' transitions applied inside the task's lease.

    A branch cannot release the lease its siblings hold, so it waits inside it: a retry
    sleeps, a callback is looked at again now and then, a full limit is tried again soon;
    an effect whose outcome is unknown blocks the branch (the step then reconciles).
    """

    def __init__(self, branches: Branches, name: str, frame: BranchFrame) -> None:
        self._branches = branches
        self._name = name
        self._frame = frame
        self._cycle = branches.cycle

    @property
    def frame(self) -> BranchFrame:
        """The branch's progress."""
        return self._frame

    def running(self) -> bool:
        """Whether the branch has a step to run next."""
        return self._frame.status is BranchStatus.RUNNING and self._frame.cursor is not None

    def steps(self) -> Mapping[str, Step]:
        """The branch's steps by id."""
        return self._branches.branch(self._name).steps

    def context(self, step: Step) -> StepContext:
        """What a step of the branch runs with: the branch's scope, spend and reservation."""
        frame = self._frame
        branches = self._branches
        spend = Spend(
            functools.partial(branches.spend_limits, frame),
            functools.partial(branches.charge, frame),
        )
        scope = self._cycle.scope(frame, **branches.context(self._name))
        return StepContext(self._cycle, frame, scope, spend, branches.kinds)

    async def before(self, step: Step) -> CycleOutcome | None:
        """Fail the branch once the task has run its ``max_steps`` (branches count in it).

        The step then fails (or its ``catch`` routes), and the task's next step ends it.
        """
        cycle = self._cycle
        if cycle.checkpoint.steps_run < cycle.definition.max_steps:
            return None
        message = (
            f"the task ran {cycle.checkpoint.steps_run} steps, its definition's max_steps, "
            f"in branch {self._name!r}: a loop that does not end?"
        )
        self._fail({"name": "MaxStepsExceeded", "message": message, "step": step.id})
        return None

    async def apply(self, step: Step, transition: Transition) -> CycleOutcome | None:
        """Carry out what a step of the branch came to."""
        frame, cycle = self._frame, self._cycle
        if isinstance(transition, Goto):
            self._enter(transition.target)
        elif isinstance(transition, Advance):
            frame.outputs[step.id] = transition.output
            if transition.next is None:
                self._succeed(transition.output)
            else:
                self._enter(transition.next)
        elif isinstance(transition, Finish):
            self._succeed(transition.output)
        elif isinstance(transition, Failed):
            self._failed(step, transition.error)
        elif isinstance(transition, Retry):  # inside a branch, a retry keeps the lease
            cycle.retry_scheduled(
                step.id, transition.occurrence, transition.attempt, transition.error,
                transition.delay,
            )  # fmt: skip
            await cycle.commit()
            await anyio.sleep(transition.delay)
        elif isinstance(transition, Reconcile):
            frame.status = BranchStatus.BLOCKED
            frame.pending = transition.occurrence
            cycle.reconciliation_required(step.id, transition.occurrence, transition.error)
        else:
            await self._wait(step, transition)
        return None

    async def _wait(self, step: Step, wait: Wait) -> None:
        """Wait inside the lease: for a callback (looking now and then), or a limit's room."""
        if wait.reason is WaitReason.LIMIT:
            assert wait.delay_seconds is not None
            await anyio.sleep(min(wait.delay_seconds, LIMIT_BRANCH_RECHECK))
            return
        if wait.reason is not WaitReason.CALLBACK or not isinstance(wait.wait, CallbackWait):
            raise AssertionError(f"a {wait.reason} wait cannot run in a branch: {step.id}")
        assert isinstance(step, EffectStep) and step.callback is not None
        token = wait.wait.callback
        since = self._branches.callbacks_since.setdefault(token, anyio.current_time())
        timeout = step.callback.timeout
        if timeout is None or anyio.current_time() - since < timeout:
            await anyio.sleep(CALLBACK_POLL)
            return
        # Past its timeout: the token expires; the step's next look fails it with Timeout.
        callbacks = self._cycle.services.store.callbacks
        await self._cycle.retrying(functools.partial(callbacks.expire, token))

    def _failed(self, step: Step, error: Error) -> None:
        """A step failed for good: its catch (within the branch), else the branch fails."""
        cycle, frame, name = self._cycle, self._frame, self._name
        target = catch_target(getattr(step, "catch", ()), error["name"])
        if target is None:
            self._fail({**error, "step": step.id})
            return
        frame.outputs[step.id] = {"error": error}
        cycle.events.append(
            Event(EventKind.CAUGHT, {"step": step.id, "branch": name, "error": error,
                                     "next": target})
        )  # fmt: skip
        self._enter(target)

    def _fail(self, error: Error) -> None:
        """The branch fails with ``error``."""
        frame = self._frame
        frame.status = BranchStatus.FAILED
        frame.error = error
        frame.cursor = None
        self._cycle.events.append(
            Event(EventKind.BRANCH_FAILED, {"step": self._branches.step.id,
                                            "branch": self._name, "error": error})
        )  # fmt: skip

    def _enter(self, target: str | None) -> None:
        self._frame.enter(target)
        self._cycle.checkpoint.steps_run += 1

    def _succeed(self, output: Any) -> None:
        frame = self._frame
        frame.status = BranchStatus.SUCCEEDED
        frame.output = output
        frame.cursor = None
        self._cycle.events.append(
            Event(EventKind.BRANCH_SUCCEEDED, {"step": self._branches.step.id,
                                               "branch": self._name})
        )  # fmt: skip


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception of a task group's that is not a cancellation, else the group."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = first_error(exc)
        if not isinstance(exc, anyio.get_cancelled_exc_class() | BaseExceptionGroup):
            return exc
    return group


KIND = StepKind(run)
