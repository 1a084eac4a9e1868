"""Deploys and triggers: the event triggers of a definition follow its newest version.

A definition's ``triggers:`` (docs/events.md) are read by an emit from the definition's
newest registered version: each deploy of that version writes the events it has triggers
for (``toolkit_event_triggers``); a deploy of an older version, or again of the same, changes
nothing.
"""

from __future__ import annotations

from toolkit.definition import WorkflowDefinition
from toolkit.store.database import Database


async def sync_triggers(db: Database, definition: WorkflowDefinition) -> None:
    """Make the trigger rows of ``definition``'s name follow its newest registered version."""
    events = sorted({trigger.event for trigger in definition.triggers})
    await db.execute(
        "sync_event_triggers",
        {"name": definition.name, "version": definition.version, "events": events},
    )
