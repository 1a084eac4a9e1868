"""The definition catalog: registered ``(name, version, digest)`` and their bodies (DESIGN §2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from psycopg.types.json import Jsonb

from toolkit.definition import WorkflowDefinition, definition_from_body
from toolkit.errors import (
    DefinitionConflict,
    DefinitionError,
    DefinitionFault,
    DefinitionInUse,
    DefinitionRetired,
    ScheduleConflict,
    UnknownDefinition,
)
from toolkit.store.database import Database
from toolkit.store.event_deploy import sync_event_uses
from toolkit.store.schedule_deploy import refuse_breaking, sync_declared

DeployOutcome = Literal["registered", "unchanged"]


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    """A registered definition version with its task counts by state.

    Attributes:
        served: a live worker has this version loaded.
        unavailable: live tasks (queued, leased, waiting) of this version that no live
            worker can run: *definition unavailable* (DESIGN §5).
    """

    name: str
    version: int
    digest: str
    retired: bool
    served: bool
    task_counts: dict[str, int]

    @property
    def unavailable(self) -> int:
        """Live tasks no live worker can run (0 while the version is served)."""
        if self.served:
            return 0
        return sum(self.task_counts.get(s, 0) for s in ("queued", "leased", "waiting"))


class DefinitionCatalog:
    """Registered definition versions, stored in ``toolkit_definitions``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def deploy(self, definition: WorkflowDefinition) -> DeployOutcome:
        """Register a definition version, and bring the schedules it declares in step.

        When the version is the newest registered, the schedules its YAML declares are
        made, changed or removed to match it (:func:`~toolkit.store.schedule_deploy.
        sync_declared`); re-deploying it changes nothing.

        Returns:
            ``"registered"`` when new, ``"unchanged"`` when the same digest was registered.

        Raises:
            DefinitionConflict: the same ``(name, version)`` is registered with another
                digest; the message names what changed and asks for a version bump.
            DefinitionError: the definition carries faults of checks made stricter for new
                registrations (``new_only_faults``) and this version is not registered yet
                with this digest: it would be a new registration.
            ScheduleConflict: a new version that would break a schedule: a declared name
                another schedule holds, or a schedule of the store whose input its input
                schema refuses (docs/schedules.md).
        """
        if definition.new_only_faults:
            await self._refuse_new_only([definition])
        try:
            existing: WorkflowDefinition | None = await self.get(
                definition.name, definition.version
            )
        except UnknownDefinition:
            existing = None
        if existing is not None and existing.digest != definition.digest:
            raise DefinitionConflict(_conflict_message(existing, definition))
        if existing is None:
            await refuse_breaking(self._db, definition)
        inserted = await self._db.fetch_one(
            "insert_definition",
            {
                "name": definition.name,
                "version": definition.version,
                "digest": definition.digest,
                "body": Jsonb(definition.body),
                "source": definition.source,
            },
        )
        if inserted is None:  # registered meanwhile, by another deploy
            existing = await self.get(definition.name, definition.version)
            if existing.digest != definition.digest:
                raise DefinitionConflict(_conflict_message(existing, definition))
        await sync_declared(self._db, definition)
        await sync_event_uses(self._db, definition)
        return "registered" if inserted is not None else "unchanged"

    async def deploy_all(self, definitions: Sequence[WorkflowDefinition]) -> list[DeployOutcome]:
        """Register several versions, or none of them when one conflicts.

        Every definition is checked against the registered versions first; only when none
        conflicts are the new ones registered.

        Returns:
            One outcome per definition, in order.

        Raises:
            DefinitionConflict: a version is registered with another digest (one line per
                conflicting definition); nothing was registered.
            DefinitionError: a definition that is not registered yet carries faults of
                checks made stricter for new registrations; nothing was registered.
            ScheduleConflict: a new version would break a schedule (see :meth:`deploy`), or
                two definitions declare one schedule name; nothing was registered.
        """
        await self._refuse_new_only(definitions)
        conflicts, breaking = [], []
        declared: dict[str, WorkflowDefinition] = {}
        for definition in definitions:
            for schedule in definition.schedules:
                other = declared.setdefault(schedule.name, definition)
                if other.name != definition.name:
                    breaking.append(
                        f"schedule {schedule.name!r} is declared by both {other.name} and "
                        f"{definition.name}: rename one"
                    )
            try:
                existing = await self.get(definition.name, definition.version)
            except UnknownDefinition:
                try:
                    await refuse_breaking(self._db, definition)
                except ScheduleConflict as exc:
                    breaking.append(exc.message)
                continue
            if existing.digest != definition.digest:
                conflicts.append(_conflict_message(existing, definition))
        if conflicts:
            raise DefinitionConflict("\n".join(conflicts))
        if breaking:
            raise ScheduleConflict("\n".join(breaking))
        return [await self.deploy(definition) for definition in definitions]

    async def _refuse_new_only(self, definitions: Sequence[WorkflowDefinition]) -> None:
        """Refuse the definitions whose stricter-check faults would make a new registration.

        A version registered before the check (same name, version and digest) is not new:
        it keeps running (docs/decisions.md).

        Raises:
            DefinitionError: with the faults of every such definition.
        """
        faults: list[DefinitionFault] = []
        for definition in definitions:
            if not definition.new_only_faults:
                continue
            try:
                existing = await self.get(definition.name, definition.version)
            except UnknownDefinition:
                existing = None
            if existing is None or existing.digest != definition.digest:
                faults += definition.new_only_faults
        if faults:
            raise DefinitionError(faults)

    async def get(self, name: str, version: int | None = None) -> WorkflowDefinition:
        """Load a registered definition; the latest non-retired version when ``version`` is None.

        Raises:
            UnknownDefinition: nothing is registered under that name (and version).
        """
        if version is None:
            row = await self._db.fetch_one("latest_definition", {"name": name})
        else:
            row = await self._db.fetch_one("get_definition", {"name": name, "version": version})
        if row is None:
            what = f"{name!r}" if version is None else f"{name!r} version {version}"
            raise UnknownDefinition(f"no definition {what} is deployed (run `toolkit deploy`)")
        return definition_from_body(row["body"], source=row["source"])

    async def submittable(self, name: str, version: int | None = None) -> WorkflowDefinition:
        """The version a new task is pinned to: ``version``, or the latest non-retired one.

        Raises:
            UnknownDefinition: nothing is registered under that name (and version).
            DefinitionRetired: ``version`` is retired, or (``version`` None) every version is.
        """
        if version is not None:
            row = await self._db.fetch_one("get_definition", {"name": name, "version": version})
            if row is not None and row["retired_at"] is not None:
                raise DefinitionRetired(
                    f"{name} version {version} is retired: submit to a newer version, or "
                    f"restore it (`toolkit definitions restore {name} {version}`)"
                )
            return await self.get(name, version)
        try:
            return await self.get(name)
        except UnknownDefinition:
            newest = await self._db.fetch_one("newest_version", {"name": name})
            if newest is None or not newest["retired"]:
                raise
            raise DefinitionRetired(
                f"every version of {name!r} is retired (the newest is {newest['version']}):"
                " deploy a new version, or restore one (`toolkit definitions restore"
                f" {name} {newest['version']}`)"
            ) from None

    async def retire(self, name: str, version: int) -> None:
        """Stop new submissions to a version; its tasks run on.

        Raises:
            UnknownDefinition: no such version.
        """
        await self._mark(name, version, "retire_definition")

    async def restore(self, name: str, version: int) -> None:
        """Take new submissions to a retired version again (undoes :meth:`retire`).

        Raises:
            UnknownDefinition: no such version.
        """
        await self._mark(name, version, "restore_definition")

    async def _mark(self, name: str, version: int, statement: str) -> None:
        if await self._db.fetch_one(statement, {"name": name, "version": version}) is None:
            raise UnknownDefinition(f"no definition {name!r} version {version} is deployed")

    async def delete(self, name: str, version: int) -> None:
        """Delete a version that no queued, leased or waiting task references.

        Raises:
            DefinitionInUse: live tasks reference it; the message gives their counts.
            UnknownDefinition: no such version.
        """
        row = await self._db.fetch_one("delete_definition", {"name": name, "version": version})
        assert row is not None
        if row["deleted"]:
            return
        live: dict[str, int] = dict(row["live"])
        if live:
            counts = ", ".join(f"{n} {state}" for state, n in sorted(live.items()))
            raise DefinitionInUse(
                f"{name} version {version} is referenced by live tasks ({counts}); "
                "delete it once they have finished"
            )
        raise UnknownDefinition(f"no definition {name!r} version {version} is deployed")

    async def unavailable(self) -> dict[tuple[str, int], int]:
        """Live tasks (queued, leased, waiting) per version that no live worker has loaded."""
        rows = await self._db.fetch_all("unavailable_definitions")
        return {(row["definition_name"], row["definition_version"]): row["n"] for row in rows}

    async def list(self) -> list[CatalogEntry]:
        """Every registered version with its task counts by state."""
        rows = await self._db.fetch_all("list_definitions")
        return [
            CatalogEntry(
                name=row["name"],
                version=row["version"],
                digest=row["digest"],
                retired=row["retired_at"] is not None,
                served=row["served"],
                task_counts=dict(row["task_counts"]),
            )
            for row in rows
        ]


def _conflict_message(old: WorkflowDefinition, new: WorkflowDefinition) -> str:
    old_steps: dict[str, Any] = dict(old.body.get("steps", {}))
    new_steps: dict[str, Any] = dict(new.body.get("steps", {}))
    added = sorted(set(new_steps) - set(old_steps))
    removed = sorted(set(old_steps) - set(new_steps))
    changed = sorted(k for k in set(old_steps) & set(new_steps) if old_steps[k] != new_steps[k])
    parts = [
        f"steps added: {', '.join(added)}" if added else "",
        f"steps removed: {', '.join(removed)}" if removed else "",
        f"steps changed: {', '.join(changed)}" if changed else "",
    ]
    what = "; ".join(p for p in parts if p) or "top-level fields changed"
    return (
        f"{new.source or new.name}: {new.name} version {new.version} is already deployed with "
        f"another digest ({what}); bump `version` to deploy a new one"
    )
