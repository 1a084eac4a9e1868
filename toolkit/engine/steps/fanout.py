"""``parallel`` and ``map``: branches run concurrently inside the task's lease, and may wait.

Each branch has a row of its own (``toolkit_branches``): a branch's progress and its end
write that branch alone, so a map's cost stays linear in its items, and the ends of many
branches share one commit. A branch that has to wait (a timer, a signal, a callback, a
child workflow) parks: its row records the wait and the branch stops; once every live
branch waits, the task waits too (reason ``branches``), holding no lease, and a wake
resumes only the branches whose wait may have ended — the parked others are neither read
nor rewritten. A race winner or a failure is committed before anything else happens; a
decided step cancels its waiting branches at once. Reservations are taken before any
branch starts and released when the step ends. A branch runs its steps through the same
loop as the task (:func:`~toolkit.engine.protocol.run_graph`); :class:`BranchLevel` says
what their transitions mean inside a branch.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Hashable, Mapping
from typing import Any

import anyio
import anyio.abc

from toolkit import tracing
from toolkit.application import SpendLimits
from toolkit.checkpoint import BranchFrame, BranchStatus, FanOut
from toolkit.definition import Branch, MapStep, ParallelStep, Step, catch_target
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
from toolkit.errors import ExpressionError, TaskTerminal
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.store.writes import NEVER, Event
from toolkit.waits import BranchesWait, ChildWait

#: Waits that park a branch (the others keep it in the cycle).
PARKING = frozenset({
    WaitReason.TIMER, WaitReason.SIGNAL, WaitReason.CALLBACK, WaitReason.CHILD,
    WaitReason.BRANCHES,  # a nested parallel or map step whose live branches all wait
})  # fmt: skip
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
    # The step's state lives where it runs: in the checkpoint, or in the frame of the
    # branch it is nested in (its branches have rows of their own either way).
    holder = ctx.frame if isinstance(ctx.frame, BranchFrame) else cp
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
    fan = holder.fanout
    if fan is None or fan.occurrence != occurrence:
        fan = FanOut(occurrence)
        holder.fanout = fan
        cycle.events.append(
            Event(EventKind.FANOUT_STARTED, {"step": step.id, "branches": len(names)})
        )
    if holder is cp and isinstance(cp.wait, BranchesWait):
        cp.wait = None  # woken: the branches whose wait may have ended are read back
    # (a nested step's branch keeps its wait: parking again for it rewrites nothing)
    if step.reserve is not None and fan.reserved is None:  # top-level steps only
        refused = await reserve(cycle, step, fan, len(names))
        if refused is not None:
            return refused
    branches = Branches(ctx, step, fan, names, items)
    await branches.resume()
    outer = cycle.fanning_out  # True for a nested step: its enclosing branches run too
    cycle.fanning_out = True
    try:
        await branches.run()
    finally:
        cycle.fanning_out = outer
    return await branches.end()


class Branches:
    """The branches of one parallel or map step occurrence, run inside one cycle.

    Only the branches this cycle runs are in memory (``fan.branches``): those resumed
    (running, blocked, or waiting with a wake or a passed timer) and those it begins. The
    others are parked in their rows; ``fan.started`` and ``fan.ended`` count them all.
    """

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
        self.holder = ctx.frame if isinstance(ctx.frame, BranchFrame) else ctx.cycle.checkpoint
        #: What the level holding the step may spend, and the step outputs it sees.
        self.outer_spend = ctx.spend
        self.outer_steps: Mapping[str, Any] = ctx.scope["steps"]
        #: A nested step's branches see the enclosing branch's context as ``parent``, and
        #: their signal address is the enclosing one's and their name (``0/approval``).
        self.parent: dict[str, Any] | None = None
        self.address = f"{ctx.address}/" if ctx.address is not None else ""
        if isinstance(ctx.frame, BranchFrame):
            outer = ctx.scope["context"]
            self.parent = {k: outer[k] for k in ("branch", "index", "item", "parent") if k in outer}
        self.step = step
        self.fan = fan
        self.names = names
        self.items = items
        self.positions = {name: index for index, name in enumerate(names)}
        self.scope = anyio.CancelScope()
        #: Branches running now in this cycle, and an event set each time one stops.
        self.running = 0
        self.stopped = anyio.Event()
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

    @property
    def decided(self) -> bool:
        """Whether the step's outcome is known: a race won, or a branch failed (mode all)."""
        return self.fan.winner is not None if self.racing else self.fan.failure is not None

    def level(self, name: str, frame: BranchFrame) -> BranchLevel:
        """The level branch ``name`` runs at."""
        return BranchLevel(self, name, frame)

    def _hold(self, name: str, frame: BranchFrame, **stored: Any) -> None:
        self.fan.branches[name] = frame
        self.cycle.hold_branch(self.fan.occurrence, name, self.positions[name], frame, **stored)

    async def resume(self) -> None:
        """Read back the branches to run, and make them ready to run again.

        A takeover's lost attempts count, resolved blocked branches run again, and waiting
        ones with a wake or a passed timer look at their wait again.
        """
        cycle, fan, holder = self.cycle, self.fan, self.holder
        if holder.pending is not None and holder.pending.startswith(f"{fan.occurrence}/"):
            holder.pending = None  # the blocked branch keeps its own pending occurrence
        if fan.inline:
            self._upgrade_inline()
        elif fan.started:
            store = cycle.services.store.branches
            for row in await cycle.retrying(
                functools.partial(
                    store.resumable, cycle.task.id, fan.occurrence, tenant=cycle.task.tenant
                )
            ):
                frame = BranchFrame.from_json(row.frame)
                frame.due = row.due
                self._hold(row.name, frame, stored=row.frame, seen=row.wakes,
                           stored_seen=row.seen)  # fmt: skip
        for name, frame in list(fan.branches.items()):
            if frame.status is BranchStatus.BLOCKED:
                frame.status = BranchStatus.RUNNING  # its effect finds the resolution, or blocks
                continue
            if frame.status is BranchStatus.WAITING:
                frame.status = BranchStatus.RUNNING  # its step looks at its wait again
                continue
            if (
                frame.status is not BranchStatus.RUNNING
                or not cycle.task.recovered
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
                if frame.ended:  # its lost attempts failed it: it ends here, and may decide
                    self._settle(name, frame)

    def _upgrade_inline(self) -> None:
        """A format-1 checkpoint kept every branch inline: count them, store them as rows.

        Ended branches are written once and dropped from memory; a map item missing below
        the highest begun (never the case for maps that began their items in order) begins
        again from its start.
        """
        fan = self.fan
        inline = fan.branches
        fan.branches = {}
        fan.inline = False
        begun = [name for name in self.names if name in inline]
        if isinstance(self.step, MapStep):
            fan.started = max((int(name) + 1 for name in begun), default=0)
        else:
            fan.started = len(self.names) if begun else 0
        for name in self.names[: fan.started]:
            frame = inline.get(name) or self._new_frame(name)
            self._hold(name, frame)
            if frame.ended:
                fan.ended += 1
                if frame.status is BranchStatus.FAILED and fan.failure is None:
                    fan.failure = {"branch": name, "error": frame.error or {}}
                self._release(name)

    def _new_frame(self, name: str) -> BranchFrame:
        return BranchFrame.start(self.branch(name).start, f"{self.fan.occurrence}/{name}/")

    def _release(self, name: str) -> None:
        """Drop an ended or parked branch from memory (its row keeps it)."""
        self.fan.branches.pop(name, None)
        self.cycle.release_branch(self.fan.occurrence, name)

    async def run(self) -> None:
        """Run the branches read back, and begin the others.

        A map begins its items in item order, at most ``max_concurrency`` live at once (a
        waiting item is live).
        """
        try:
            with self.scope:
                async with anyio.create_task_group() as group:
                    for name, frame in list(self.fan.branches.items()):
                        if frame.status is BranchStatus.RUNNING:
                            self._start(group, name, frame)
                    await self._begin(group)
        except BaseExceptionGroup as group_error:
            raise first_error(group_error) from None

    async def _begin(self, group: anyio.abc.TaskGroup) -> None:
        """Begin branches not begun yet, while the bound allows; stop once decided."""
        fan, step = self.fan, self.step
        limit = step.max_concurrency if isinstance(step, MapStep) else None
        while fan.started < len(self.names) and not (self.decided and not self.racing):
            if limit is not None and fan.started - fan.ended >= limit:
                if self.running == 0:
                    return  # every live item waits: nothing frees a place in this cycle
                await self.stopped.wait()
                self.stopped = anyio.Event()
                continue
            name = self.names[fan.started]
            fan.started += 1
            frame = self._new_frame(name)
            self._hold(name, frame)
            self._start(group, name, frame)

    def _start(self, group: anyio.abc.TaskGroup, name: str, frame: BranchFrame) -> None:
        self.running += 1
        group.start_soon(self._run_branch, name, frame)

    async def _run_branch(self, name: str, frame: BranchFrame) -> None:
        try:
            kind = "branch" if self.items is None else "item"
            attributes = functools.partial(self._span_attributes, kind, name)
            with tracing.span(f"{kind} {name}", attributes) as span:
                await run_graph(self.level(name, frame))
                span.outcome(str(frame.status))
            decided = self._settle(name, frame)
            # The branch's end (or its wait) is durable as it happens, and with it what the
            # end decided (a race's winner, the failure of the step), before all else.
            await self.cycle.commit()
            if decided and self.step.cancel_losers:
                self.scope.cancel()
        finally:
            self.running -= 1
            self.stopped.set()

    def _span_attributes(self, kind: str, name: str) -> tracing.Attributes:
        """The attributes of the span of branch (or item) ``name`` in this cycle."""
        return {"task.id": self.cycle.task.id, "step.name": self.step.id, kind: name}

    def _settle(self, name: str, frame: BranchFrame) -> bool:
        """A branch stopped (ended, parked or blocked): count it and record what it decided.

        It is dropped from memory unless blocked. Returns whether it decided the step.
        """
        if frame.ended:
            self.fan.ended += 1
        decided = self._ended(name, frame)
        if frame.status is not BranchStatus.BLOCKED:
            self._release(name)
        return decided

    def _ended(self, name: str, frame: BranchFrame) -> bool:
        """Record what a branch's end means for the step; whether it decided the step."""
        step, fan = self.step, self.fan
        if self.racing and frame.status is BranchStatus.SUCCEEDED and fan.winner is None:
            fan.winner = name
            won = {"step": step.id, "branch": self.address + name}
            self.cycle.events.append(Event(EventKind.RACE_WON, won))
            return True
        if not self.racing and frame.status is BranchStatus.FAILED and fan.failure is None:
            fan.failure = {"branch": name, "error": frame.error or {}}
            return True
        return False

    async def end(self) -> Transition:
        """What the step came to once no branch runs in this cycle.

        Decided: the branches still waiting are cancelled, and the step ends. Undecided
        with a branch blocked: reconcile first. Undecided with branches waiting: the task
        waits for them (reason ``branches``). Else every branch ended: the step's output.
        """
        cycle, step, fan = self.cycle, self.step, self.fan
        for name, frame in list(fan.branches.items()):
            if frame.status is BranchStatus.RUNNING:  # stopped by cancel_losers
                frame.status = BranchStatus.CANCELLED
                fan.ended += 1
                cycle.events.append(
                    Event(EventKind.BRANCH_CANCELLED, {"step": step.id,
                                                       "branch": self.address + name,
                                                       "pending": frame.pending})
                )  # fmt: skip
                await self._let_go(frame)
                self._release(name)
        blocked = [frame for frame in fan.branches.values() if frame.status is BranchStatus.BLOCKED]
        waiting = fan.started - fan.ended - len(blocked)
        if not self.decided:
            if blocked:  # undecided while an effect's outcome is unknown: reconcile first
                pending = blocked[0].pending
                assert pending is not None
                return Reconcile(pending)
            if waiting > 0 or fan.started < len(self.names):
                event = Event(EventKind.WAITING, {"step": step.id, "branches": waiting})
                return Wait(WaitReason.BRANCHES, BranchesWait(fan.occurrence), event,
                            run_at=NEVER)  # fmt: skip
        await cycle.commit()  # every branch's state is in its row before they are read
        store = cycle.services.store.branches
        if waiting > 0:
            await self._cancel_waiting()
        tenant = cycle.task.tenant
        ended = functools.partial(store.ended, cycle.task.id, fan.occurrence, tenant=tenant)
        rows = await cycle.retrying(ended)
        frames = {row.name: BranchFrame.from_json(row.frame) for row in rows}
        winner = fan.winner
        output: Any = None
        error: Error | None = None
        if self.racing and winner is not None:
            output = frames[winner].output
        elif not self.racing and fan.failure is not None:
            error = {**fan.failure["error"], "branch": fan.failure["branch"]}
        elif self.racing:
            errors = {name: frame.error for name, frame in frames.items()}
            error = {"name": "AllBranchesFailed", "errors": errors,
                     "message": f"every branch of step {step.id!r} failed"}  # fmt: skip
        else:
            outputs = [frames[name].output for name in self.names]
            mapped = isinstance(step, MapStep)
            output = outputs if mapped else dict(zip(self.names, outputs, strict=True))
        release(cycle, fan)
        if error is None or catch_target(step.catch, error["name"]) is not None:
            self.holder.fanout = None
            cycle.end_branches(fan.occurrence)
        # else the failure fails the task: the step's state and rows stay with it, for
        # ``toolkit show`` and so that a redrive runs again only what did not succeed
        detail: dict[str, Any] = {"step": step.id, "outcome": "failed" if error else "succeeded"}
        if winner is not None:
            detail["winner"] = winner
        cycle.events.append(Event(EventKind.FANOUT_ENDED, detail))
        if error is not None:
            return Failed(error)
        cycle.check_result(output, step.id, "the branches")
        return Advance(output, step.next)

    async def _cancel_waiting(self) -> None:
        """Cancel the waiting branches of a decided step.

        Nothing of theirs runs, so nothing is undone; a child one waits for is cancelled, a
        callback's token expires.
        """
        cycle, step, fan = self.cycle, self.step, self.fan
        store = cycle.services.store
        rows = await cycle.retrying(
            functools.partial(
                store.branches.waiting, cycle.task.id, fan.occurrence, tenant=cycle.task.tenant
            )
        )
        for row in rows:
            frame = BranchFrame.from_json(row.frame)
            cycle.events.append(
                Event(EventKind.BRANCH_CANCELLED, {"step": step.id,
                                                   "branch": self.address + row.name,
                                                   "waiting": frame.waits_for()})
            )  # fmt: skip
            await self._let_go(frame)

    async def _let_go(self, frame: BranchFrame) -> None:
        """What a cancelled branch leaves: its child is cancelled, its callbacks expire."""
        cycle = self.cycle
        store = cycle.services.store
        wait = frame.wait
        if isinstance(wait, ChildWait):
            try:
                await cycle.retrying(
                    functools.partial(
                        store.tasks.cancel,
                        wait.child,
                        "its branch cancelled",
                        tenant=cycle.task.tenant,
                    )
                )
            except TaskTerminal:
                pass  # it ended meanwhile
        if frame.fanout is not None:  # a nested step: its waiting branches go too
            rows = await cycle.retrying(
                functools.partial(
                    store.branches.waiting,
                    cycle.task.id,
                    frame.fanout.occurrence,
                    tenant=cycle.task.tenant,
                )
            )
            for row in rows:
                await self._let_go(BranchFrame.from_json(row.frame))
        for occurrence in [o for o in cycle.checkpoint.callbacks if o.startswith(frame.prefix)]:
            token = cycle.checkpoint.callbacks.pop(occurrence).token
            expire = functools.partial(store.callbacks.expire, token, tenant=cycle.task.tenant)
            await cycle.retrying(expire)

    def context(self, name: str) -> dict[str, Any]:
        """What ``context`` adds in branch ``name``: its name, a map's item and index.

        In a nested step's branch, the enclosing branch's context too, as ``parent``.
        """
        context: dict[str, Any] = {"branch": name}
        if self.items is not None:
            context["index"] = index = int(name)
            context["item"] = self.items[index]
        if self.parent is not None:
            context["parent"] = self.parent
        return context

    def spend_limits(self, frame: BranchFrame) -> SpendLimits:
        """What an effect of ``frame`` may spend: its reservation's rest, else the task's."""
        limits: dict[str, tuple[Hashable, float]] = dict(self.outer_spend.limits())
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
            self.outer_spend.charge(outside)


class BranchLevel:
    """One branch's graph: its steps' transitions applied inside the task's lease.

    A wait for a timer, a signal, a callback or a child parks the branch (its row records
    the wait and its deadline). A branch cannot release the lease its siblings hold for a
    short pause: a retry sleeps, a full limit is tried again soon. An effect whose outcome
    is unknown blocks the branch (the step then reconciles).
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

    @property
    def address(self) -> str:
        """The branch's address (``3/approval`` when nested): its events and signals use it."""
        return self._branches.address + self._name

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
        scope = self._cycle.scope(frame, branches.outer_steps, **branches.context(self._name))
        return StepContext(self._cycle, frame, scope, spend, branches.kinds, self.address)

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
        """Park the branch until its wait ends; a full limit is tried again soon instead.

        A branch that waits on for the same wait (woken for nothing) keeps the deadline it
        had; a new wait's deadline is fixed now, in database time.
        """
        frame, cycle = self._frame, self._cycle
        if wait.reason is WaitReason.LIMIT:
            assert wait.delay_seconds is not None
            await anyio.sleep(min(wait.delay_seconds, LIMIT_BRANCH_RECHECK))
            return
        if wait.reason not in PARKING:
            raise AssertionError(f"a {wait.reason} wait cannot run in a branch: {step.id}")
        if frame.wait == wait.wait:
            frame.status = BranchStatus.WAITING
            return  # waits on: its row is as it was
        run_at = None
        if wait.run_at is not None:
            run_at = None if wait.run_at == NEVER else wait.run_at
        elif wait.delay_seconds is not None:
            now = await cycle.retrying(cycle.services.store.leases.database_now)
            run_at = (now + datetime.timedelta(seconds=wait.delay_seconds)).isoformat()
        # no await from here on: a write never finds the wait without its deadline
        frame.status = BranchStatus.WAITING
        frame.wait = wait.wait
        frame.run_at = run_at
        detail = {**(wait.event.detail or {}), "branch": self.address}
        cycle.events.append(Event(wait.event.kind, detail))

    def _failed(self, step: Step, error: Error) -> None:
        """A step failed for good: its catch (within the branch), else the branch fails."""
        cycle, frame = self._cycle, self._frame
        target = catch_target(getattr(step, "catch", ()), error["name"])
        if target is None:
            self._fail({**error, "step": step.id})
            return
        frame.outputs[step.id] = {"error": error}
        cycle.events.append(
            Event(EventKind.CAUGHT, {"step": step.id, "branch": self.address, "error": error,
                                     "next": target})
        )  # fmt: skip
        self._enter(target)

    def _fail(self, error: Error) -> None:
        """The branch fails with ``error``."""
        self._moved_on()
        frame = self._frame
        frame.status = BranchStatus.FAILED
        frame.error = error
        frame.cursor = None
        self._cycle.events.append(
            Event(EventKind.BRANCH_FAILED, {"step": self._branches.step.id,
                                            "branch": self.address, "error": error})
        )  # fmt: skip

    def _enter(self, target: str | None) -> None:
        self._moved_on()
        self._frame.enter(target)
        self._cycle.checkpoint.steps_run += 1

    def _moved_on(self) -> None:
        """The branch's step ended: whatever it waited for is over."""
        frame = self._frame
        frame.wait = None
        frame.run_at = None
        frame.due = False

    def _succeed(self, output: Any) -> None:
        self._moved_on()
        frame = self._frame
        frame.status = BranchStatus.SUCCEEDED
        frame.output = output
        frame.cursor = None
        self._cycle.events.append(
            Event(EventKind.BRANCH_SUCCEEDED, {"step": self._branches.step.id,
                                               "branch": self.address})
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
