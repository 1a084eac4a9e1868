"""Deploys and events: a definition's triggers and event schemas follow its newest version.

A definition's ``triggers:`` and ``events:`` (docs/events.md) are read by an emit from the
definition's newest registered version: each deploy of that version writes the events it
has triggers for or declares (``toolkit_event_uses``); a deploy of an older version, or
again of the same, changes nothing.
"""

from __future__ import annotations

from toolkit.definition import WorkflowDefinition
from toolkit.store.database import Database


async def sync_event_uses(db: Database, definition: WorkflowDefinition) -> None:
    """Make the event rows of ``definition``'s name follow its newest registered version."""
    await db.execute(
        "sync_event_uses",
        {
            "name": definition.name,
            "version": definition.version,
            "triggered": sorted({trigger.event for trigger in definition.triggers}),
            "declared": sorted(definition.events),
        },
    )
