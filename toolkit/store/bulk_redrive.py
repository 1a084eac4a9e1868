"""Bulk redrive: the failed and cancelled tasks a filter matches, redriven through a plan.

A redrive plan (:meth:`Bulk.plan_redrive <toolkit.store.bulk.Bulk.plan_redrive>`) holds the
matched tasks with the state and fencing token each had, like any bulk plan. Its preview
plans every task's redrive without writing (:func:`toolkit.store.redrive.plan`) and sums
what they would do (:class:`RedrivePreview`): the effects called again, by step; those
refused; the tasks that cannot be redriven as asked, and why. Applying redrives each task in
a transaction of its own that also records the task's outcome in the plan, and only while
the task's state and token are still those planned; the redrive statement itself is a
compare-and-set on them (DESIGN §7). A task redriven, pruned or changed since is reported,
not touched, and an apply that stopped half-way is finished by running it again.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from toolkit.counts import counted
from toolkit.errors import NotRedrivable, UnknownDefinition, UnknownTask
from toolkit.store.database import Database
from toolkit.store.queries import query
from toolkit.store.redrive import apply_plan
from toolkit.store.redrive import plan as plan_one
from toolkit.store.redrive_plan import EffectFate, RedriveOptions, RedrivePlan

#: Kinds of step, or of reason, a preview lists by name before it sums the rest.
PREVIEW_KINDS = 8

_TASK_PREFIX = re.compile(r"^(redrive refused; )?task \d+: ")


def options_of(arguments: Mapping[str, Any]) -> RedriveOptions:
    """The redrive options a plan's arguments hold (see :func:`arguments_of`)."""
    return RedriveOptions(
        arguments.get("from"), frozenset(arguments.get("rerun", ())),
        arguments.get("timeout"), arguments.get("version"),
    )  # fmt: skip


def arguments_of(options: RedriveOptions, reason: str | None) -> dict[str, Any]:
    """A plan's arguments (JSON) for ``options`` and the operator's ``reason``."""
    return {
        "from": options.from_step, "rerun": sorted(options.rerun), "timeout": options.timeout,
        "version": options.version, "reason": reason,
    }  # fmt: skip


@dataclasses.dataclass
class RedrivePreview:
    """What redriving a plan's tasks would do, summed over the tasks.

    Attributes:
        redrivable: tasks whose redrive may apply.
        refused: tasks whose redrive is refused or impossible as asked (``reasons`` says why).
        resume: the redrivable tasks by the step they resume at.
        effects: effects by fate (``again``, ``rerun``, ``reconcile``, ``refused``,
            ``kept``), children redriven with their parent included.
        again: effects called again (``again`` and ``rerun``), by ``step (handler)``.
        branches_again: branches or map items that run again.
        children: failed children redriven with their parent.
        reserves: what the resumed tasks reserve again from budgets, by resource.
        reasons: the tasks refused, by reason (the task id left out, so alike ones add up).
    """

    redrivable: int = 0
    refused: int = 0
    resume: Counter[str] = dataclasses.field(default_factory=Counter)
    effects: Counter[str] = dataclasses.field(default_factory=Counter)
    again: Counter[str] = dataclasses.field(default_factory=Counter)
    branches_again: int = 0
    children: int = 0
    reserves: Counter[str] = dataclasses.field(default_factory=Counter)
    reasons: Counter[str] = dataclasses.field(default_factory=Counter)

    def add(self, found: RedrivePlan) -> None:
        """Count one task's plan."""
        if found.refused:
            self.refused += 1
            for reason in _refusals(found):
                self.reasons[reason] += 1
            return
        self.redrivable += 1
        self.resume[found.resume] += 1
        for each in _with_children(found):
            for effect in each.effects:
                self.effects[str(effect.fate)] += 1
                if effect.fate in (EffectFate.AGAIN, EffectFate.RERUN):
                    self.again[f"{effect.step} ({effect.handler})"] += 1
            self.branches_again += len(each.branches_again)
            self.reserves.update(each.reserves)
            self.children += sum(1 for child in each.children if child.redriven)

    def add_refusal(self, reason: str) -> None:
        """Count one task that cannot be redriven as asked, and why."""
        self.refused += 1
        self.reasons[_TASK_PREFIX.sub("", reason)] += 1

    def to_json(self) -> dict[str, Any]:
        """The preview as a plan's arguments keep it."""
        return {
            "redrivable": self.redrivable, "refused": self.refused, "resume": dict(self.resume),
            "effects": dict(self.effects), "again": dict(self.again),
            "branches_again": self.branches_again, "children": self.children,
            "reserves": dict(self.reserves), "reasons": dict(self.reasons),
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RedrivePreview:
        """The preview :meth:`to_json` wrote."""
        return cls(
            data["redrivable"], data["refused"], Counter(data["resume"]), Counter(data["effects"]),
            Counter(data["again"]), data["branches_again"], data["children"],
            Counter(data["reserves"]), Counter(data["reasons"]),
        )  # fmt: skip

    def lines(self) -> list[str]:
        """The preview in words, one line a kind of thing (``toolkit bulk redrive``)."""
        out = [f"redriven: {counted(self.redrivable, 'task')}"]
        if self.redrivable:
            out.append(f"resume at step: {_listed(self.resume)}")
            again = self.effects[EffectFate.AGAIN] + self.effects[EffectFate.RERUN]
            by_step = f" ({_listed(self.again)})" if self.again else ""
            out.append(f"effects called again: {again:,}{by_step}")
            if self.effects[EffectFate.RERUN]:
                out.append(
                    "of them not idempotent, called again with a new idempotency key "
                    f"(--rerun): {self.effects[EffectFate.RERUN]:,}"
                )
            if self.effects[EffectFate.RECONCILE]:
                out.append(
                    "effects sent to reconciliation first (outcome unknown): "
                    f"{self.effects[EffectFate.RECONCILE]:,}"
                )
            out.append(
                "effects not called again (recorded results kept): "
                f"{self.effects[EffectFate.KEPT]:,}"
            )
            if self.branches_again:
                out.append(f"branches or map items run again: {self.branches_again:,}")
            if self.children:
                out.append(f"failed children redriven with their parent: {self.children:,}")
            out.extend(
                f"reserved again: {amount:g} {resource} in all"
                for resource, amount in sorted(self.reserves.items())
            )
        if self.refused:
            out.append(f"refused, left as they are: {counted(self.refused, 'task')}")
            for reason, n in self.reasons.most_common(PREVIEW_KINDS):
                out.append(f"  {n:,} tasks: {reason}" if n != 1 else f"  1 task: {reason}")
            if len(self.reasons) > PREVIEW_KINDS:
                out.append(f"  ... and {len(self.reasons) - PREVIEW_KINDS} other reasons")
        return out


async def preview(db: Database, plan_id: int, options: RedriveOptions) -> RedrivePreview:
    """Plan the redrive of every task of plan ``plan_id``, writing nothing; the sums.

    Reads each task's evidence, events and branches (as ``toolkit redrive --dry-run``
    does one): its cost is linear in the tasks and their histories.
    """
    found = RedrivePreview()
    for row in await db.fetch_all("bulk_plan_task_ids", {"plan_id": plan_id}):
        try:
            found.add(await plan_one(db, row["task_id"], options, tenant=row["tenant"]))
        except UnknownTask:
            found.add_refusal("deleted since it matched")
        except (NotRedrivable, UnknownDefinition) as exc:
            found.add_refusal(str(exc))
    return found


async def apply_item(
    db: Database,
    plan_id: int,
    task_id: int,
    tenant: str,
    arguments: Mapping[str, Any],
    operator: str,
) -> str | None:
    """Redrive one task (of ``tenant``) of plan ``plan_id``; record its outcome; one transaction.

    Returns:
        The item's outcome (``applied``, ``moved``, ``gone`` or ``refused``), or None when
        another apply running at once settled it first.
    """
    options = options_of(arguments)
    found: RedrivePlan | None = None
    problem: str | None = None
    try:
        found = await plan_one(db, task_id, options, tenant=tenant)
        if found.refused:
            problem = "; ".join(_refusals(found))
    except UnknownTask:
        pass
    except (NotRedrivable, UnknownDefinition) as exc:
        problem = _TASK_PREFIX.sub("", str(exc))
    try:
        async with db.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            item_of = {"plan_id": plan_id, "task_id": task_id, "tenant": tenant}
            await cursor.execute(query("bulk_lock_item"), item_of)
            item = await cursor.fetchone()
            if item is None:
                return None
            await cursor.execute(query("lock_task_state"), {"task_id": task_id, "tenant": tenant})
            now = await cursor.fetchone()
            planned = (item["state"], item["lease_token"])
            detail: dict[str, Any] | None = None
            if now is None:
                outcome = "gone"
            elif (now["state"], now["lease_token"]) != planned:
                outcome = "moved"
            elif problem is not None or found is None:
                outcome, detail = "refused", {"reason": problem}
            elif (found.state, found.token) != planned:
                outcome = "moved"  # it changed between the plan above and the lock
            else:
                await apply_plan(conn, found, arguments.get("reason"), operator, plan_id)
                outcome, detail = "applied", found.summary()
            await cursor.execute(
                query("bulk_mark_item"),
                {**item_of, "outcome": outcome,
                 "detail": Jsonb(detail) if detail is not None else None},
            )  # fmt: skip
            return outcome
    except NotRedrivable as exc:  # a child it redrives changed since its plan
        await db.execute(
            "bulk_mark_item",
            {"plan_id": plan_id, "task_id": task_id, "tenant": tenant, "outcome": "refused",
             "detail": Jsonb({"reason": _TASK_PREFIX.sub("", str(exc))})},
        )  # fmt: skip
        return "refused"


def _with_children(found: RedrivePlan) -> Iterable[RedrivePlan]:
    yield found
    for child in found.children:
        if child.plan is not None:
            yield from _with_children(child.plan)


def _refusals(found: RedrivePlan) -> list[str]:
    """Why the redrive is refused: its own reasons and its children's."""
    return [
        reason if each is found else f"child task {each.task_id}: {reason}"
        for each in _with_children(found)
        for reason in each.refusals
    ]


def _listed(counts: Counter[str]) -> str:
    """``"a: 3, b: 1"``, the most frequent kinds first, the rest summed."""
    shown = [f"{kind}: {n:,}" for kind, n in counts.most_common(PREVIEW_KINDS)]
    rest = sum(n for _, n in counts.most_common()[PREVIEW_KINDS:])
    if rest:
        shown.append(f"{len(counts) - PREVIEW_KINDS} more: {rest:,}")
    return ", ".join(shown)
