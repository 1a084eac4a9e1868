"""The work a notebook widget's buttons start: run on the event loop, waited for, reported.

A widget callback cannot await, so a button schedules its coroutine on the running loop;
:meth:`WidgetWork.settle` waits for what was scheduled, and an error a user can act on
shows in the widget's status line instead of a traceback. Shared by the
:class:`~toolkit.history.notebook.TaskBrowser` and the
:class:`~toolkit.history.schedule_board.ScheduleBoard`.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Coroutine
from typing import Any

import ipywidgets as widgets

from toolkit.errors import ToolkitError


class WidgetWork:
    """Scheduled work and a status line.

    Attributes:
        status: the status line's last text.
        status_line: the status line widget.
    """

    def __init__(self) -> None:
        self.status = ""
        self.status_line = widgets.HTML()
        self._pending: set[asyncio.Task[Any]] = set()

    def _schedule(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run a coroutine on the running loop (a widget callback cannot await)."""
        task = asyncio.get_running_loop().create_task(self._reporting(work))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _reporting(self, work: Coroutine[Any, Any, Any]) -> None:
        try:
            await work
        except (ToolkitError, ValueError) as exc:
            self._say(f"error: {exc}", error=True)

    async def settle(self) -> None:
        """Wait until the work buttons and filters scheduled is done.

        Work scheduled meanwhile (a refresh that opens a task) is waited for too.
        """
        while self._pending:
            await asyncio.gather(*list(self._pending))

    def _say(self, text: str, *, error: bool = False) -> None:
        self.status = text
        color = "#c62828" if error else "#2e7d32"
        self.status_line.value = f'<span style="color:{color}">{html.escape(text)}</span>'
