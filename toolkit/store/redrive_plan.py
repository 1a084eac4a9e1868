"""What a redrive would do: where the task resumes, which effects run again, which are refused.

A redrive (issue 19, docs/reliability.md "Redrive") brings a ``failed`` or ``cancelled`` task
back. :func:`plan_redrive` works from what the store recorded — the checkpoint, the effect
evidence, the events, the rows of a parallel or map step, the children — and changes
nothing: it returns a :class:`RedrivePlan` with the new checkpoint and the preview. The
store applies a plan in one fenced statement (:mod:`toolkit.store.redrive`).

The rules, in short:

- **Default**: resume at the step that failed (or where the task was cancelled), same
  occurrence, a fresh attempt budget; every completed step keeps its recorded result. A
  parallel or map step runs again only its branches that did not succeed, each from where
  it stopped; a ``workflow`` step whose child failed redrives that child.
- **``from_step``**: resume at an earlier step, as a new occurrence (so new idempotency
  keys). Every step reachable from it in the graph that this task ran is *re-planned*: its
  recorded result is dropped and it runs again. A completed effect that is not idempotent
  is refused unless named in ``rerun``.
- An effect whose intent is recorded without an outcome goes to reconciliation first, as
  on any resume.
- Compensations that ran are not undone: a compensated task is refused unless
  ``from_step`` re-plans every compensated step.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from toolkit.checkpoint import BranchFrame, BranchStatus, Checkpoint
from toolkit.definition import (
    DistributedMapStep,
    FailStep,
    MapStep,
    ParallelStep,
    WorkflowDefinition,
)
from toolkit.definition.walk import edges
from toolkit.errors import NotRedrivable
from toolkit.lifecycle import TaskState
from toolkit.store.redrive_children import ChildRedrive, children_to_redrive, top_step

#: Lines of one kind a preview shows before it says how many more there are.
PREVIEW_LINES = 12


class EffectFate(enum.StrEnum):
    """What a redrive does with an effect this task already called."""

    #: completed before the resume point: not called again, its recorded result stays
    KEPT = "kept"
    #: called again: the failed step, or an idempotent effect the redrive re-plans
    AGAIN = "again"
    #: not idempotent, completed, re-planned and named with ``--rerun``: called again with
    #: a new idempotency key, recorded as a deliberate re-execution
    RERUN = "rerun"
    #: not idempotent, completed (or of unknown outcome), re-planned, not named: refused
    REFUSED = "refused"
    #: its intent is recorded without an outcome: an operator reconciles it first
    RECONCILE = "reconcile"


@dataclasses.dataclass(frozen=True)
class PlannedEffect:
    """An effect occurrence this task called, and what the redrive does with it.

    ``occurrence`` is its latest occurrence (``charge#1``, ``each#1/3/charge#1``);
    ``result`` its recorded result when it completed.
    """

    step: str
    occurrence: str
    handler: str
    idempotent: bool
    fate: EffectFate
    result: Any = None


@dataclasses.dataclass(frozen=True)
class RedriveOptions:
    """What the operator asked for (``toolkit redrive``).

    Attributes:
        from_step: resume at this step instead of the failed one.
        rerun: non-idempotent steps allowed to be called again (with a new key).
        timeout: a new workflow deadline, seconds from now (required for a task failed
            by its deadline, or whose deadline has passed since).
        version: the definition version to resume on; None for the pinned one.
    """

    from_step: str | None = None
    rerun: frozenset[str] = frozenset()
    timeout: float | None = None
    version: int | None = None


@dataclasses.dataclass(frozen=True)
class RedriveFacts:
    """What the store recorded of a task, as the planner reads it.

    Attributes:
        task: the task row (``TaskRecord``).
        pinned: its pinned definition, or None when that version was deleted.
        target: the definition it resumes on (the pinned one, or ``--version``'s).
        evidence: its effect evidence rows, oldest first.
        events: its event rows, oldest first.
        branches: the rows of its parallel or map step in progress (name, status, frame),
            in position order; empty when none.
        children: its children by the parent occurrence that started them (id, state).
        deadline_passed: its workflow deadline is in the past now.
    """

    task: Any
    pinned: WorkflowDefinition | None
    target: WorkflowDefinition
    evidence: Sequence[Mapping[str, Any]]
    events: Sequence[Mapping[str, Any]]
    branches: Sequence[Mapping[str, Any]]
    children: Mapping[str, Mapping[str, Any]]
    deadline_passed: bool


@dataclasses.dataclass(frozen=True)
class RedrivePlan:
    """What a redrive of one task does; ``checkpoint`` and the rest are what it writes.

    Attributes:
        task_id: the task; ``tenant`` its tenant.
        state: its state (``failed`` or ``cancelled``) and ``token`` its fencing token as
            read: the redrive applies only while both are still those.
        workflow: its definition name; ``version`` the pinned version, ``to_version`` the
            one it resumes on.
        resume: the step it resumes at; ``occurrence`` the occurrence it runs there.
        from_step: True when the operator chose the step (``--from``).
        effects: the effects this task called, in the order its evidence recorded them.
        branches_again: names of the branches or items that run again.
        branches_kept: how many keep their result.
        reserves: what the resumed run reserves again from the budgets, by resource.
        children: children redriven with it, or replaced by a new one.
        refusals: why the redrive is refused (empty when it may apply).
        timeout: the new workflow deadline, seconds from the redrive; None keeps it.
        checkpoint: the checkpoint the task resumes from (JSON).
        branch_frames: rows of the step in progress to write (name, status, frame).
        branches_dropped: step occurrences whose rows go.
        digest: the digest of the definition it resumes on.
        notes: what the operator should know that does not refuse the redrive (a resume
            at a ``fail`` step, which fails again).
    """

    task_id: int
    tenant: str
    state: str
    token: int
    workflow: str
    version: int
    to_version: int
    resume: str
    occurrence: str
    from_step: bool
    effects: tuple[PlannedEffect, ...]
    branches_again: tuple[str, ...]
    branches_kept: int
    reserves: Mapping[str, float]
    children: tuple[ChildRedrive, ...]
    refusals: tuple[str, ...]
    timeout: float | None
    checkpoint: dict[str, Any]
    branch_frames: tuple[dict[str, Any], ...]
    branches_dropped: tuple[str, ...]
    digest: str
    notes: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        """Whether the redrive may not apply (its own refusals or a child's)."""
        return bool(self.refusals) or any(
            child.plan is not None and child.plan.refused for child in self.children
        )

    def count(self, fate: EffectFate) -> int:
        """How many effects (a redriven child's included) have ``fate``."""
        own = sum(1 for effect in self.effects if effect.fate is fate)
        return own + sum(child.plan.count(fate) for child in self.children if child.plan)

    def summary(self) -> dict[str, Any]:
        """The plan as the ``redriven`` event records it (JSON)."""
        return {
            "resume": self.resume,
            "occurrence": self.occurrence,
            "from": self.from_step,
            "version": [self.version, self.to_version],
            "again": [e.occurrence for e in self.effects if e.fate is EffectFate.AGAIN],
            "rerun": [e.occurrence for e in self.effects if e.fate is EffectFate.RERUN],
            "reconcile": [e.occurrence for e in self.effects if e.fate is EffectFate.RECONCILE],
            "kept": self.count(EffectFate.KEPT),
            "branches": list(self.branches_again),
            "children": [child.child_id for child in self.children if child.redriven],
            "timeout": self.timeout,
        }

    def lines(self, indent: str = "") -> list[str]:
        """The preview: what runs again, what does not, what is refused (text lines)."""
        moved = f", onto version {self.to_version}" if self.to_version != self.version else ""
        out = [
            f"{indent}task {self.task_id} ({self.workflow} v{self.version}, {self.state})"
            f" resumes at step {self.resume!r}{moved}"
            + (" (--from: a new occurrence)" if self.from_step else " with a fresh attempt budget")
        ]
        pad = indent + "  "
        groups = (
            (EffectFate.AGAIN, "called again"),
            (EffectFate.RERUN, "called again with a new idempotency key (--rerun)"),
            (EffectFate.RECONCILE, "to reconciliation first (outcome unknown)"),
            (EffectFate.REFUSED, "refused: not idempotent, would be called again"),
            (EffectFate.KEPT, "not called again (recorded results kept)"),
        )
        for fate, title in groups:
            chosen = [effect for effect in self.effects if effect.fate is fate]
            if not chosen:
                continue
            out.append(f"{pad}{title}: {len(chosen)}")
            for effect in chosen[:PREVIEW_LINES]:
                result = f" -> {_short(effect.result)}" if fate is EffectFate.KEPT else ""
                out.append(f"{pad}  {effect.occurrence} ({effect.handler}){result}")
            if len(chosen) > PREVIEW_LINES:
                out.append(f"{pad}  ... and {len(chosen) - PREVIEW_LINES} more")
        if self.branches_again or self.branches_kept:
            shown = ", ".join(self.branches_again[:PREVIEW_LINES])
            more = len(self.branches_again) - PREVIEW_LINES
            shown += f" and {more} more" if more > 0 else ""
            out.append(
                f"{pad}branches: {len(self.branches_again)} run again ({shown or 'none'}),"
                f" {self.branches_kept} keep their result"
            )
        for resource, amount in self.reserves.items():
            out.append(f"{pad}reserves again: {amount:g} {resource}")
        if self.timeout is not None:
            out.append(f"{pad}new workflow deadline: {self.timeout:g} s from now")
        items = [child for child in self.children if child.item]
        for child in [*(c for c in self.children if not c.item), *items[:PREVIEW_LINES]]:
            if child.redriven:
                out.append(f"{pad}child task {child.child_id} (step {child.step!r}) is redriven:")
                assert child.plan is not None
                out.extend(child.plan.lines(pad + "  "))
            else:
                out.append(
                    f"{pad}step {child.step!r} starts a new child; task {child.child_id} is"
                    " left as it is"
                )
        if len(items) > PREVIEW_LINES:
            out.append(f"{pad}and {len(items) - PREVIEW_LINES} more failed items are redriven")
        out.extend(f"{pad}refused: {reason}" for reason in self.refusals)
        out.extend(f"{pad}note: {note}" for note in self.notes)
        return out


def plan_redrive(facts: RedriveFacts, options: RedriveOptions) -> RedrivePlan:
    """Plan the redrive of one task (nothing is written).

    Args:
        facts: what the store recorded of the task.
        options: what the operator asked for.

    Returns:
        The plan; ``refusals`` says what stops it (non-idempotent effects not named with
        ``rerun``, compensations that ran), the preview says the rest.

    Raises:
        NotRedrivable: the task is in another state than ``failed`` or ``cancelled``; the
            step is unknown or was never reached; ``rerun`` names a step that would not
            run again; ``timeout`` is missing or not wanted; the version does not map.
    """
    task = facts.task
    if task.state not in ("failed", "cancelled"):
        raise NotRedrivable(
            f"task {task.id} {TaskState(task.state).phrase(task.wait_reason)}: only a failed"
            " or cancelled task can be redriven"
        )
    cp = Checkpoint.from_json(task.checkpoint)
    graph = facts.pinned or facts.target
    _check_timeout(facts, options)
    step, replanned, new_occurrence = _resume_point(facts, cp, graph, options)
    _check_maps(facts, cp, replanned, step)
    target = facts.target
    history = _effects_by_occurrence(facts.evidence)
    refusals: list[str] = []
    compensated = _compensated(facts, cp, replanned, options, refusals)

    fan = cp.fanout
    resumed_fan = fan is not None and not new_occurrence and fan.occurrence == cp.occurrence(step)
    kept_rows, reset_rows = _branch_rows(facts.branches) if resumed_fan else ({}, [])
    old = {cp.occurrence(name) for name in replanned}  # replaced by new occurrences
    if new_occurrence:
        cp.visits[step] = cp.visits.get(step, 0) + 1
    occurrence = cp.occurrence(step)

    effects: list[PlannedEffect] = []
    # a resumed distributed map lists its pages again (its progress ended with it)
    pages = f"{occurrence}/page/" if isinstance(target.steps[step], DistributedMapStep) else None
    for occ, rows in history.items():
        fate = _fate(occ, rows[-1], cp, step, occurrence, replanned, resumed_fan, kept_rows,
                     reset_rows, options)  # fmt: skip
        if pages is not None and occ.startswith(pages):
            fate = EffectFate.AGAIN
        last = rows[-1]
        effect = PlannedEffect(
            last["step"], occ, last["handler"], bool(last["idempotent"]), fate,
            last.get("result") if last["record"] == "completed" else None,
        )  # fmt: skip
        effects.append(effect)
        if fate is EffectFate.REFUSED:
            what = "its outcome is unknown" if last["record"] == "started" else "it completed"
            refusals.append(
                f"step {effect.step!r} ({effect.handler}, {occ}) is not idempotent and {what};"
                f" name it with --rerun {effect.step} to call it again with a new key"
            )
    wanted = {e.step for e in effects if e.fate in (EffectFate.RERUN, EffectFate.REFUSED)}
    unknown = sorted(set(options.rerun) - wanted)
    if unknown:
        raise NotRedrivable(
            f"--rerun {', '.join(unknown)}: no completed non-idempotent effect of that step"
            " would be called again by this redrive"
        )

    # the checkpoint the task resumes from
    cp.cursor = step
    cp.wait = None
    cp.resolution = None
    cp.lapses = None
    cp.pending = None
    for name in replanned:
        cp.outputs.pop(name, None)
    for key in [k for k in cp.attempts if top_step(k) in replanned or k == occurrence]:
        del cp.attempts[key]
    for key in [k for k in cp.callbacks if top_step(k) in replanned]:
        del cp.callbacks[key]
    cp.compensable = [c for c in cp.compensable if c.step not in replanned]
    if compensated:
        cp.compensating = None
    recorded = history.get(occurrence)
    if recorded and recorded[-1]["record"] == "started" and not new_occurrence:
        cp.pending = occurrence  # its outcome is unknown: the effect reconciles first
    dropped: list[str] = []
    frames: list[dict[str, Any]] = []
    again: list[str] = []
    if fan is not None and not resumed_fan:
        _returned(cp, fan)
        dropped.append(fan.occurrence)
        cp.fanout = None
    elif fan is not None:
        fan.failure = None
        fan.winner = None
        fan.ended = len(kept_rows)
        _returned(cp, fan)
        for row in reset_rows:
            frame = BranchFrame.from_json(row["frame"])
            if frame.fanout is not None:
                raise NotRedrivable(
                    f"branch {row['name']!r} of step {step!r} stopped in its nested step"
                    f" {frame.cursor or (frame.error or {}).get('step')!r}, which a redrive"
                    f" does not resume; redrive --from {step} to run the step again"
                )
            frame = _resumed_branch(frame)
            frames.append({"name": row["name"], "status": str(frame.status),
                           "frame": frame.to_json()})  # fmt: skip
            again.append(row["name"])
        if fan.started < len(facts.branches):
            fan.started = len(facts.branches)
    children = children_to_redrive(facts, cp, step, old, frames)
    reserves = _reserves(target, step, replanned)
    notes: tuple[str, ...] = ()
    if isinstance(target.steps.get(step), FailStep):
        notes = (
            f"step {step!r} is a fail step: resumed there, the task fails again; redrive "
            "--from an earlier step to run more than that",
        )
    return RedrivePlan(
        task_id=task.id, tenant=task.tenant, state=task.state, token=task.lease_token,
        workflow=task.definition_name, version=task.definition_version,
        to_version=target.version, resume=step, occurrence=occurrence,
        from_step=options.from_step is not None, effects=tuple(effects),
        branches_again=tuple(again), branches_kept=len(kept_rows), reserves=reserves,
        children=tuple(children), refusals=tuple(refusals), timeout=options.timeout,
        checkpoint=cp.to_json(), branch_frames=tuple(frames), branches_dropped=tuple(dropped),
        digest=target.digest, notes=notes,
    )  # fmt: skip


# --- the parts of a plan ---------------------------------------------------------------------


def _check_timeout(facts: RedriveFacts, options: RedriveOptions) -> None:
    """A task failed by its deadline (or whose deadline passed since) needs a new one."""
    task = facts.task
    timed_out = (task.error or {}).get("name") == "Timeout" and _deadline_event(facts.events)
    if options.timeout is not None and options.timeout <= 0:
        raise NotRedrivable(f"--timeout must be positive, got {options.timeout:g} s")
    if timed_out and options.timeout is None:
        raise NotRedrivable(
            f"task {task.id} failed at its workflow deadline: redrive it with --timeout"
            " DURATION, a new deadline from now"
        )
    if facts.deadline_passed and options.timeout is None:
        raise NotRedrivable(
            f"task {task.id}'s workflow deadline has passed: redrive it with --timeout"
            " DURATION, a new deadline from now"
        )
    if options.timeout is not None and not (timed_out or facts.deadline_passed):
        raise NotRedrivable(
            f"--timeout is for a task failed by its workflow deadline (or whose deadline has"
            f" passed); task {task.id}'s has not"
        )


def _deadline_event(events: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the deadline passed in the task's latest run (since its last redrive)."""
    for event in reversed(events):
        if event["kind"] == "redriven":
            return False
        if event["kind"] == "deadline_passed":
            return True
    return False


def _resume_point(
    facts: RedriveFacts, cp: Checkpoint, graph: WorkflowDefinition, options: RedriveOptions
) -> tuple[str, set[str], bool]:
    """The step to resume at, the steps re-planned, and whether it runs as a new occurrence."""
    task = facts.task
    where = f"{graph.name} version {graph.version}"
    if options.from_step is not None:
        step = options.from_step
        if step not in graph.steps:
            raise NotRedrivable(f"--from {step}: {where} has no step {step!r}")
        if step not in cp.visits:
            raise NotRedrivable(
                f"--from {step}: task {task.id} never reached step {step!r}; name a step it ran"
            )
        return step, reachable(graph, step) & set(cp.visits), True
    error = task.error or {}
    step = str(cp.cursor or error.get("step") or "")
    if step not in graph.steps:
        raise NotRedrivable(
            f"task {task.id} ended outside any step of {where}; redrive it --from a step"
        )
    kind = graph.steps[step]
    fan = cp.fanout
    if isinstance(kind, ParallelStep | MapStep) and (
        fan is None or fan.occurrence != cp.occurrence(step)
    ):
        # its branches' state is gone (the deadline abandoned them): it runs anew
        return step, {step}, True
    return step, set(), False


def reachable(graph: WorkflowDefinition, start: str) -> set[str]:
    """The steps reachable from ``start`` (itself included), every edge followed."""
    seen = {start}
    todo = [start]
    while todo:
        for edge in edges(graph.steps[todo.pop()]):
            if edge.target is not None and edge.target in graph.steps and edge.target not in seen:
                seen.add(edge.target)
                todo.append(edge.target)
    return seen


def _check_maps(facts: RedriveFacts, cp: Checkpoint, replanned: set[str], step: str) -> None:
    """Onto another version: what the task keeps, and where it resumes, must map onto it."""
    target, pinned = facts.target, facts.pinned
    if pinned is not None and target.digest == pinned.digest:
        return
    where = f"{target.name} version {target.version}"
    kept = sorted(set(cp.visits) - replanned - {step})
    for name in [step, *kept]:
        if name not in target.steps:
            role = "resumes at" if name == step else "completed"
            raise NotRedrivable(
                f"does not map onto {where}: it has no step {name!r} (the task {role} it)"
            )
        if pinned is not None and name in pinned.steps:
            was, now = type(pinned.steps[name]), type(target.steps[name])
            if was is not now:
                raise NotRedrivable(
                    f"does not map onto {where}: step {name!r} is a {_kind(now)} there, a"
                    f" {_kind(was)} in version {pinned.version}"
                )
    resumed = target.steps[step]
    if isinstance(resumed, ParallelStep) and cp.fanout is not None:
        missing = [row["name"] for row in facts.branches if row["name"] not in resumed.branches]
        if missing:
            raise NotRedrivable(
                f"does not map onto {where}: step {step!r} has no branch {missing[0]!r}"
            )
    if isinstance(resumed, ParallelStep | MapStep) and cp.fanout is not None:
        for row in facts.branches:
            graph = (
                resumed.branch if isinstance(resumed, MapStep) else resumed.branches[row["name"]]
            )
            for inner in row["frame"].get("visits", {}):
                if inner not in graph.steps:
                    raise NotRedrivable(
                        f"does not map onto {where}: branch {row['name']!r} of step {step!r}"
                        f" has no step {inner!r}"
                    )


def _kind(cls: type) -> str:
    return cls.__name__.removesuffix("Step").lower()


def _effects_by_occurrence(
    evidence: Iterable[Mapping[str, Any]],
) -> dict[str, list[Mapping[str, Any]]]:
    """Evidence rows by occurrence, in the order first recorded; a step's latest only.

    Of the occurrences of one step at one place (``check#1``, ``check#2`` of a loop) the
    latest stands for the step: that is what would run again.
    """
    by_occurrence: dict[str, list[Mapping[str, Any]]] = collections.OrderedDict()
    for row in evidence:
        if row["occurrence"].startswith("compensate/"):
            continue  # a compensation's call: never run again by a redrive
        by_occurrence.setdefault(row["occurrence"], []).append(row)
    latest: dict[str, str] = {}
    for occ in by_occurrence:
        latest[_place(occ)] = occ
    return {occ: rows for occ, rows in by_occurrence.items() if latest[_place(occ)] == occ}


def _place(occurrence: str) -> str:
    """An occurrence without its step's visit number: ``each#1/3/charge`` of ``...#2``."""
    return occurrence.rsplit("#", 1)[0]


def _fate(
    occ: str,
    last: Mapping[str, Any],
    cp: Checkpoint,
    step: str,
    occurrence: str,
    replanned: set[str],
    resumed_fan: bool,
    kept_rows: Mapping[str, Mapping[str, Any]],
    reset_rows: Sequence[Mapping[str, Any]],
    options: RedriveOptions,
) -> EffectFate:
    """What the redrive does with effect occurrence ``occ`` (its latest record ``last``)."""
    record = last["record"]
    idempotent = bool(last["idempotent"])
    if top_step(occ) in replanned:  # it runs again, as a new occurrence
        if record == "failed" or idempotent:
            return EffectFate.AGAIN
        return EffectFate.RERUN if last["step"] in options.rerun else EffectFate.REFUSED
    if "/" not in occ:  # the task's own graph
        if occ == occurrence and record != "completed":
            return EffectFate.RECONCILE if record == "started" else EffectFate.AGAIN
        return EffectFate.KEPT
    fanout, branch = occ.split("/")[:2]
    if not resumed_fan or cp.fanout is None or fanout != cp.fanout.occurrence:
        return EffectFate.KEPT
    if branch in kept_rows or record == "completed":
        return EffectFate.KEPT
    return EffectFate.RECONCILE if record == "started" else EffectFate.AGAIN


def _compensated(
    facts: RedriveFacts,
    cp: Checkpoint,
    replanned: set[str],
    options: RedriveOptions,
    refusals: list[str],
) -> bool:
    """Whether compensations ran; refuse unless ``--from`` re-plans every compensated step.

    They are read from the ``compensated`` events since the task's last redrive (the
    checkpoint of a compensated task keeps none).
    """
    undone: list[str] = []
    for event in facts.events:
        if event["kind"] == "redriven":
            undone = []
        elif event["kind"] == "compensated":
            undone.append(str((event["detail"] or {}).get("step")))
    if not undone and cp.compensating is None:
        return False
    if options.from_step is None or not set(undone) <= replanned:
        earliest = undone[-1] if undone else cp.cursor
        refusals.append(
            f"compensations ran (they undid {', '.join(repr(s) for s in undone)}) and a"
            " redrive does not undo them; redrive --from a step at or before"
            f" {earliest!r} to run those steps again"
        )
    return True


def _branch_rows(
    rows: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The rows of the step in progress: those that succeeded, and the others (run again)."""
    kept = {row["name"]: row for row in rows if row["status"] == "succeeded"}
    return kept, [row for row in rows if row["status"] != "succeeded"]


def _resumed_branch(frame: BranchFrame) -> BranchFrame:
    """A branch that failed, was cancelled or waited, made ready to run again.

    A failed branch resumes at its failed step with a fresh attempt budget; a cancelled or
    waiting one where it stood, its wait started again. An intent without an outcome stays
    pending: the effect reconciles first.
    """
    if frame.cursor is None:
        step = (frame.error or {}).get("step")
        if step is not None:
            frame.cursor = str(step)
            frame.attempts.pop(frame.occurrence(frame.cursor), None)
    frame.status = BranchStatus.RUNNING
    frame.error = None
    frame.output = None
    frame.wait = None
    frame.run_at = None
    return frame


def _returned(cp: Checkpoint, fan: Any) -> None:
    """Take the step's reservation off the checkpoint: the resumed step reserves again.

    The budgets got it back when the task ended (the engine released it, or the store's
    trigger returned it).
    """
    for resource, amount in (fan.reserved or {}).items():
        line = cp.budget.get(resource)
        if line is not None:
            line.reserved -= amount
            line.spent += fan.spent.get(resource, 0.0)
    fan.reserved = None
    fan.spent = {}


def _reserves(target: WorkflowDefinition, step: str, replanned: set[str]) -> dict[str, float]:
    """What the resumed run reserves again: its parallel and map steps that will run.

    A reservation ``per_branch`` is shown per branch (key ``RESOURCE per branch``).
    """
    out: dict[str, float] = {}
    for name in sorted(set(replanned) | {step}):
        reserve = getattr(target.steps.get(name), "reserve", None)
        if reserve is None:
            continue
        for resource, amount in reserve.amounts.items():
            key = f"{resource} per branch" if reserve.per_branch else resource
            out[key] = out.get(key, 0.0) + float(amount)
    return out


def _short(value: Any) -> str:
    """A recorded result in one short line."""
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
