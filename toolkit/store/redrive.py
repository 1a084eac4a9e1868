"""Redrive: bring a failed or cancelled task back, from the store's side (issue 19).

:func:`redrive` reads what the store recorded of a task, plans the redrive
(:func:`~toolkit.store.redrive_plan.plan_redrive`: where it resumes, which effects run
again, which are refused) and, unless asked for a dry run, applies it: the task, and any
child it redrives with it, each in one compare-and-set statement (``redrive_task``), all in
one transaction. Applying bumps the fencing token, as a claim does, so a worker that still
believed it held the task can never commit after it (DESIGN §2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from toolkit.definition import WorkflowDefinition, definition_from_body
from toolkit.errors import NotRedrivable, RedriveRefused
from toolkit.store.database import Database
from toolkit.store.definitions import DefinitionCatalog
from toolkit.store.queries import query
from toolkit.store.redrive_children import ChildRedrive
from toolkit.store.redrive_plan import (
    RedriveFacts,
    RedriveOptions,
    RedrivePlan,
    plan_redrive,
)
from toolkit.store.task_reads import TaskReads

#: How deep a redrive follows failed children (a child's child ...).
MAX_CHILD_DEPTH = 8


async def plan(
    db: Database,
    task_id: int,
    options: RedriveOptions,
    *,
    depth: int = 0,
    tenant: str | None = None,
) -> RedrivePlan:
    """Plan the redrive of ``task_id`` (and of the failed children it redrives); write nothing.

    ``tenant``: the task's, if known; else looked up by the id (a child has its parent's).

    Raises:
        UnknownTask: no such task.
        NotRedrivable: the task (or a child it would redrive) cannot be redriven as asked.
        UnknownDefinition: ``options.version`` is not deployed.
    """
    facts = await _facts(db, task_id, options, tenant)
    found = plan_redrive(facts, options)
    children = []
    for child in found.children:
        if child.redriven:
            if depth >= MAX_CHILD_DEPTH:
                raise NotRedrivable(
                    f"task {task_id}: children nested deeper than {MAX_CHILD_DEPTH}; redrive"
                    " the deepest failed child first"
                )
            inner = await plan(
                db, child.child_id, RedriveOptions(), depth=depth + 1, tenant=found.tenant
            )
            child = dataclasses.replace(child, plan=inner)
        children.append(child)
    return dataclasses.replace(found, children=tuple(children))


async def redrive(
    db: Database,
    task_id: int,
    options: RedriveOptions,
    *,
    reason: str | None = None,
    operator: str = "operator",
    dry_run: bool = False,
    plan_id: int | None = None,
    token: int | None = None,
    tenant: str | None = None,
) -> RedrivePlan:
    """Plan the redrive of ``task_id`` and, unless ``dry_run``, apply it.

    Args:
        db: the store's database.
        task_id: the task.
        options: where to resume, what may run again, the version and the deadline.
        reason: why (recorded in the ``redriven`` event).
        operator: who (the event's writer).
        dry_run: only plan.
        plan_id: the bulk plan this redrive belongs to, recorded in the event.
        token: apply only while the task's fencing token is still this one (the token a
            preview showed); None: the token the plan reads.
        tenant: the task's tenant, if known; else looked up by the id.

    Returns:
        The plan (its preview: ``plan.lines()``).

    Raises:
        UnknownTask: no such task.
        NotRedrivable: it cannot be redriven as asked, or it changed while redriving.
        RedriveRefused: the plan is refused (not idempotent effects not named with
            ``rerun``, compensations that ran); ``exc.plan`` is the plan.
    """
    found = await plan(db, task_id, options, tenant=tenant)
    if dry_run:
        return found
    if token is not None and found.token != token:
        raise NotRedrivable(
            f"task {task_id} changed since its preview (fencing token {found.token}, not"
            f" {token}); preview it again"
        )
    if found.refused:
        raise RedriveRefused("\n".join(_refusals(found)), plan=found)
    async with db.transaction() as conn:
        await apply_plan(conn, found, reason, operator, plan_id)
    return found


async def apply_plan(
    conn: psycopg.AsyncConnection[Any],
    found: RedrivePlan,
    reason: str | None,
    operator: str,
    plan_id: int | None = None,
) -> None:
    """Apply ``found`` in the caller's transaction: the task and its redriven children.

    Each task is one compare-and-set statement on the state and fencing token the plan
    read, innermost child first.

    Raises:
        NotRedrivable: a task changed since the plan was made (roll the transaction back).
    """
    for each in _innermost_first(found):
        await _apply(conn, each, reason, operator, plan_id)


def _refusals(found: RedrivePlan) -> list[str]:
    lines = [f"task {found.task_id}: {reason}" for reason in found.refusals]
    for child in found.children:
        if child.plan is not None:
            lines.extend(_refusals(child.plan))
    return [f"redrive refused; {lines[0]}", *lines[1:]] if lines else []


def _innermost_first(found: RedrivePlan) -> Iterable[RedrivePlan]:
    for child in found.children:
        if child.plan is not None:
            yield from _innermost_first(child.plan)
    yield found


async def _apply(
    conn: psycopg.AsyncConnection[Any],
    found: RedrivePlan,
    reason: str | None,
    operator: str,
    plan_id: int | None,
) -> None:
    """One task's redrive statement; raises NotRedrivable when the task moved since."""
    fan = found.checkpoint.get("fanout") or {}
    detail = {**found.summary(), "reason": reason}
    if plan_id is not None:
        detail["plan"] = plan_id
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(
        query("redrive_task"),
        {
            "task_id": found.task_id, "tenant": found.tenant, "state": found.state,
            "token": found.token,
            "checkpoint": Jsonb(found.checkpoint), "digest": found.digest,
            "version": found.to_version, "timeout": found.timeout,
            "branches": Jsonb(list(found.branch_frames)), "fanout": fan.get("occurrence"),
            "dropped": list(found.branches_dropped), "operator": operator,
            "detail": Jsonb(detail),
        },
    )  # fmt: skip
    if await cursor.fetchone() is None:
        raise NotRedrivable(
            f"task {found.task_id} changed while redriving (it is no longer {found.state} under"
            f" token {found.token}); look again"
        )


async def _facts(
    db: Database, task_id: int, options: RedriveOptions, tenant: str | None
) -> RedriveFacts:
    """What the store recorded of ``task_id``, as the planner reads it."""
    reads = TaskReads(db)
    task = await reads.get(task_id, tenant=tenant)
    by_id = {"task_id": task_id, "tenant": task.tenant}
    pinned = await _pinned(db, by_id)
    target = pinned
    if options.version is not None and (pinned is None or options.version != pinned.version):
        target = await DefinitionCatalog(db).get(task.definition_name, options.version)
    if target is None:
        raise NotRedrivable(
            f"task {task_id}: its definition {task.definition_name} version"
            f" {task.definition_version} was deleted; redrive it onto another version with"
            " --version"
        )
    fanout = (task.checkpoint.get("fanout") or {}).get("occurrence")
    rows = (
        await db.fetch_all("ended_branches", {**by_id, "fanout": fanout})
        if fanout
        else []
    )
    children = await db.fetch_all("task_children", by_id)
    clock = await db.fetch_one("redrive_clock", by_id)
    return RedriveFacts(
        task=task,
        pinned=pinned,
        target=target,
        evidence=await reads.evidence(task_id, tenant=task.tenant),
        events=await reads.events(task_id, tenant=task.tenant),
        branches=rows,
        children={row["parent_occurrence"]: row for row in children},
        deadline_passed=bool(clock and clock["deadline_passed"]),
    )


async def _pinned(db: Database, by_id: dict[str, Any]) -> WorkflowDefinition | None:
    """The definition a task is pinned to, or None when its version was deleted.

    ``by_id``: the task's id and tenant, as the statement's parameters.
    """
    row = await db.fetch_one("task_definition_body", by_id)
    if row is None or row["body"] is None:
        return None
    return definition_from_body(row["body"])


__all__ = ["ChildRedrive", "RedriveOptions", "RedrivePlan", "apply_plan", "plan", "redrive"]
