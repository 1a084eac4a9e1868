"""The triggers a task's end no longer needs (migration 0029).

The statements that end tasks do that work themselves; the triggers stay only for the
previous release's workers. Tests of a task's end run with both: as migrated, and as a
distributed store will be, without the triggers (the ``ending`` fixture, tests/conftest.py;
docs/scaling.md).
"""

from __future__ import annotations

ENDING_TRIGGERS = (
    "toolkit_tasks_return_reservation",
    "toolkit_tasks_notify_ended",
    "toolkit_tasks_count_schedule_outcome",
    "toolkit_tasks_release_key",
)
