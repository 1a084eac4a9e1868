"""Deploys and schedules: the schedules a definition declares follow its newest version.

A definition's ``schedules:`` (docs/schedules.md, "Declared in YAML") are owned by it. Each
deploy of the newest registered version brings them in step (:func:`sync_declared`):
a declared schedule is made, or changed to what that version says (its pause, counters and
buffered ticks stay; a new cadence starts from its first tick after now), and one the
version no longer declares is removed. The sync compares before it writes, so re-deploying
a registered version, as every worker does at start, changes nothing, and a deploy cut
short is finished by the next. Before a version is registered, :func:`refuse_breaking`
refuses it when it would break a schedule: a declared name taken by another schedule, or a
schedule of the store whose input the new input schema refuses.
"""

from __future__ import annotations

import datetime
from typing import Any

from psycopg.types.json import Jsonb

from toolkit.definition import WorkflowDefinition
from toolkit.definition.schedules import SAMPLE_TICK, ScheduleDeclaration
from toolkit.errors import InputError, ScheduleConflict
from toolkit.store.database import Database
from toolkit.store.names import check_tenant
from toolkit.store.schedule_values import Schedule, cadence_json, render_tick
from toolkit.store.tags import check_tags

_SAMPLE = datetime.datetime.fromisoformat(SAMPLE_TICK)


async def refuse_breaking(db: Database, definition: WorkflowDefinition) -> None:
    """Refuse registering ``definition`` when, as the newest version, it breaks a schedule.

    A version older than the newest registered one declares nothing that applies, and
    schedules start the newest: nothing to check then.

    Raises:
        ScheduleConflict: one line per schedule: a declared name that a schedule made at run
            time or declared by another definition holds; a declared schedule whose tenant
            or tags are not valid; a schedule of the store for this definition whose input
            the new input schema refuses (update or delete it first).
    """
    if not await _is_newest(db, definition):
        return
    problems = []
    for declared in definition.schedules:
        row = await db.fetch_one("get_schedule", {"name": declared.name})
        if row is not None and (row["owner"] != "definition"
                                or row["definition_name"] != definition.name):  # fmt: skip
            owner = (
                "was made at run time" if row["owner"] == "store"
                else f"is declared by {row['definition_name']} v{row['owner_version']}"
            )  # fmt: skip
            problems.append(
                f"schedule {declared.name!r} {owner}: rename the one in "
                f"{definition.name} v{definition.version}, or delete that one first"
            )
            continue
        try:
            check_tenant(declared.tenant, path=f"schedule {declared.name!r}: tenant")
            check_tags(dict(declared.tags), path=f"schedule {declared.name!r}: tags")
        except InputError as exc:
            problems.append(f"{exc.path}: {exc.message}")
    for schedule in await _schedules_of(db, definition.name):
        if schedule.owner != "store":
            continue
        try:
            render_tick(definition, schedule.name, schedule.input, _SAMPLE, schedule.tags, db)
        except InputError as exc:
            problems.append(
                f"{exc.message} (with {definition.name} v{definition.version}): change its "
                f"input first (toolkit schedules update {schedule.name} --input ...), or "
                "delete it"
            )
    if problems:
        raise ScheduleConflict(
            f"{definition.name} v{definition.version} is not deployed:\n" + "\n".join(problems)
        )


async def sync_declared(db: Database, definition: WorkflowDefinition) -> list[str]:
    """Bring the definition's own schedules in step with ``definition``, if it is the newest.

    Returns:
        What changed, a line per schedule (``made nightly-report``, ``changed ...``,
        ``removed ...``); empty when nothing did (a re-deploy, or an older version).
    """
    if not await _is_newest(db, definition):
        return []
    now_row = await db.fetch_one("database_now")
    assert now_row is not None
    now: datetime.datetime = now_row["now"]
    held = {s.name: s for s in await _schedules_of(db, definition.name) if s.owner == "definition"}
    changes = []
    for declared in definition.schedules:
        old = held.pop(declared.name, None)
        params = _params(definition, declared)
        if old is None:
            made = await db.fetch_one(
                "create_schedule",
                {**params, "owner": "definition", "next_tick": declared.cadence.next_after(now)},
            )
            if made is not None:
                changes.append(f"made schedule {declared.name}")
        elif _differs(old, params):
            same_cadence = cadence_json(old.cadence) == params["cadence"].obj
            next_tick = old.next_tick if same_cadence else declared.cadence.next_after(now)
            await db.fetch_one("update_declared_schedule", {**params, "next_tick": next_tick})
            changes.append(f"changed schedule {declared.name}")
    for gone in held.values():
        await db.fetch_one("delete_schedule", {"name": gone.name})
        changes.append(f"removed schedule {gone.name}")
    return changes


def _params(definition: WorkflowDefinition, declared: ScheduleDeclaration) -> dict[str, Any]:
    return {
        "name": declared.name, "definition_name": definition.name,
        "owner_version": definition.version, "cadence": Jsonb(cadence_json(declared.cadence)),
        "input": Jsonb(declared.input), "tenant": declared.tenant,
        "tags": Jsonb(dict(declared.tags)), "overlap": declared.overlap,
        "catchup": declared.catchup, "catchup_window": declared.catchup_window,
        "pause_after_failures": declared.pause_after_failures,
    }  # fmt: skip


def _differs(old: Schedule, params: dict[str, Any]) -> bool:
    stored = {
        "owner_version": old.owner_version, "cadence": cadence_json(old.cadence),
        "input": old.input, "tenant": old.tenant, "tags": old.tags, "overlap": old.overlap,
        "catchup": old.catchup, "catchup_window": old.catchup_window,
        "pause_after_failures": old.pause_after_failures,
    }  # fmt: skip
    wanted = {k: v.obj if isinstance(v, Jsonb) else v for k, v in params.items()}
    return any(stored[key] != wanted[key] for key in stored)


async def _is_newest(db: Database, definition: WorkflowDefinition) -> bool:
    newest = await db.fetch_one("newest_version", {"name": definition.name})
    return newest is None or int(newest["version"]) <= definition.version


async def _schedules_of(db: Database, name: str) -> list[Schedule]:
    rows = await db.fetch_all("list_schedules", {"definition_name": name})
    return [Schedule.from_row(row) for row in rows]
