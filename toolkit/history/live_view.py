"""The TaskBrowser's live view: the open task's detail kept current while the task is live.

While a task that has not ended is open, :class:`LiveView` follows it
(``store.streams.follow``, woken by LISTEN/NOTIFY): a state change or a published item
renders the detail again, at most once per `RENDER_INTERVAL` seconds however fast they come; a
progress value only updates the progress line. Opening another task, or the task's end,
stops it. Runs on the notebook's event loop, like every other piece of widget work.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
from collections.abc import Awaitable, Callable
from typing import Any

import ipywidgets as widgets

from toolkit.store import Store

#: Fewest seconds between two renders of the detail while following.
RENDER_INTERVAL = 0.5


class LiveView:
    """Follows one open task and renders it as it changes.

    Args:
        store: the store.
        render: loads and shows the task of the given id again (the browser's detail).
        poll: seconds between reads when notifications do not come (``follow``'s poll).

    Attributes:
        line: the progress line widget (empty while nothing is followed).
        following: the id of the task followed, or None.
        progress: the latest progress value of the followed task (None: none yet).
    """

    def __init__(
        self, store: Store, render: Callable[[int], Awaitable[Any]], poll: float = 1.0
    ) -> None:
        self._store = store
        self._render = render
        self._poll = poll
        self._follower: asyncio.Task[None] | None = None
        #: Counts follows and stops: a follower whose number is not the latest ends.
        self._generation = 0
        self.line = widgets.HTML()
        self.following: int | None = None
        self.progress: Any = None

    def follow(self, task_id: int, after: int) -> None:
        """Follow ``task_id`` from its stream item number ``after`` (stopping any other)."""
        if self.following == task_id:
            return
        self.stop()
        self.following = task_id
        self._say(f"live: following task {task_id}")
        self._follower = asyncio.get_running_loop().create_task(
            self._follow(task_id, after, self._generation)
        )

    def stop(self) -> None:
        """Stop following (nothing happens when nothing is followed).

        The follower is not cancelled (a query cancelled mid-flight costs its pooled
        connection): it sees at its next wake-up that it is not followed any more and ends,
        rendering nothing more.
        """
        self._generation += 1
        self._follower = None
        self.following = None
        self.progress = None
        self.line.value = ""

    def _current(self, generation: int) -> bool:
        """Whether the follower started as ``generation`` is still the one wanted.

        A task opened again gets a new follower; the old one must not render alongside it.
        """
        return self._generation == generation

    async def _follow(self, task_id: int, after: int, generation: int) -> None:
        changed, done = asyncio.Event(), asyncio.Event()
        renderer = asyncio.get_running_loop().create_task(
            self._rendering(task_id, generation, changed, done)
        )
        try:
            async for event in self._store.streams.follow(task_id, after=after, poll=self._poll):
                if not self._current(generation):
                    break  # another task was opened, or the view stopped
                if event.kind == "progress":
                    self.progress = event.value
                    self._say(f"live: task {task_id}, progress {json.dumps(event.value)}")
                else:
                    changed.set()
        except Exception as exc:  # the database or the store went away: say so, keep the pane
            if self._current(generation):
                self._say(f"live view stopped: {exc}")
                self._generation += 1
                self.following = self._follower = None
        finally:
            done.set()
            changed.set()
            await renderer
        if self._current(generation):  # it ended: show its end, nothing more to follow
            with contextlib.suppress(Exception):
                await self._render(task_id)
            self.stop()

    async def _rendering(
        self, task_id: int, generation: int, changed: asyncio.Event, done: asyncio.Event
    ) -> None:
        """Render on each change, at most once per `RENDER_INTERVAL`, until ``done``."""
        while True:
            await changed.wait()
            changed.clear()
            if done.is_set() or not self._current(generation):
                return
            with contextlib.suppress(Exception):  # the follower reports the database's faults
                await self._render(task_id)
            await asyncio.sleep(RENDER_INTERVAL)  # what comes meanwhile: one render after

    def _say(self, text: str) -> None:
        self.line.value = f'<span style="color:#1565c0">{html.escape(text)}</span>'
