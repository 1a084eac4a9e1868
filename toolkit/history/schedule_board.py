"""The schedule board: a store's schedules, their next fire times and recent runs, in a notebook.

:class:`ScheduleBoard` shows one row per schedule (:class:`~toolkit.history.schedule_view.
ScheduleRow`) with buttons that pause (with a note), resume and trigger it through the same
store API as ``toolkit schedules pause|resume|trigger``, and a *Runs* button that filters a
:class:`~toolkit.history.notebook.TaskBrowser` to the schedule's runs (docs/schedules.md,
"In a notebook"). Like the TaskBrowser, its coroutine methods are the API; a button schedules
its coroutine on the running event loop, and errors show in the status line.

Needs the ``notebook`` extra (ipywidgets).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from toolkit.counts import counted
from toolkit.errors import ConfigError
from toolkit.history.schedule_view import ScheduleRow, read_rows, rows_text, style_html
from toolkit.history.widget_work import WidgetWork
from toolkit.store import Store
from toolkit.store.schedules import Schedule, UnknownSchedule
from toolkit.store.tasks import TaskRecord

if TYPE_CHECKING:
    from toolkit.history.notebook import TaskBrowser


class ScheduleControls:
    """The widgets of one schedule's row: its HTML, a note, and its four buttons.

    Attributes:
        cells: the row (:meth:`ScheduleRow.html <toolkit.history.schedule_view.ScheduleRow.html>`).
        note: the note a pause records.
        pause_button, resume_button, trigger_button, runs_button: its buttons.
        widget: the row's widget.
    """

    def __init__(self, name: str, act: Callable[[str, str], None]) -> None:
        self.cells = widgets.HTML()
        self.note = widgets.Text(placeholder="why pause (a note)", layout={"width": "220px"})
        self.pause_button = widgets.Button(description="Pause", icon="pause")
        self.resume_button = widgets.Button(description="Resume", icon="play")
        self.trigger_button = widgets.Button(
            description="Trigger", icon="bolt", tooltip="start one run now"
        )
        self.runs_button = widgets.Button(
            description="Runs", icon="list", tooltip="show its runs in the task browser"
        )
        for verb, button in (
            ("pause", self.pause_button), ("resume", self.resume_button),
            ("trigger", self.trigger_button), ("runs", self.runs_button),
        ):  # fmt: skip
            button.on_click(lambda _, verb=verb: act(verb, name))
        self.widget = widgets.VBox(
            [
                self.cells,
                widgets.HBox([self.note, self.pause_button, self.resume_button,
                              self.trigger_button, self.runs_button]),
            ]
        )  # fmt: skip
        self.widget.add_class("toolkit-schedule-board-row")

    def show(self, row: ScheduleRow, *, browser: bool) -> None:
        """Show ``row``; offer only the buttons it can take (Runs needs a browser)."""
        self.cells.value = row.html()
        self.pause_button.disabled = row.schedule.paused
        self.resume_button.disabled = not row.schedule.paused
        self.runs_button.disabled = not browser

    def close(self) -> None:
        """Close its widgets (a schedule deleted since the last refresh)."""
        for child in (self.cells, self.note, self.pause_button, self.resume_button,
                      self.trigger_button, self.runs_button, self.widget):  # fmt: skip
            child.close()


class ScheduleBoard(WidgetWork):
    """An ipywidgets board of the schedules of a store: when each fires next, what it ran.

    Each row shows a schedule's name, definition and owner, its cadence and time zone,
    whether it is paused (and the note why), its next fire times (from its cadence, in
    database time), its live runs, its counts of ticks fired, skipped, missed and caught
    up, and its recent runs with their states. Its buttons pause it (with the note typed
    beside them), resume it, trigger one run now, and show its runs in ``browser``.

    Use it in a notebook cell::

        browser = TaskBrowser(store)
        board = ScheduleBoard(store, browser)
        await board.refresh()
        board            # displays the widget

    The coroutine methods (:meth:`refresh`, :meth:`pause`, :meth:`resume`, :meth:`trigger`,
    :meth:`show_runs`) are the API behind the buttons; call them with ``await``. A button
    schedules its coroutine on the running event loop; :meth:`settle` waits for what was
    scheduled. Errors show in the status line, not as tracebacks.

    Attributes:
        store: the store shown.
        browser: the TaskBrowser the *Runs* button filters, or None (the button is off).
        rows: the schedules, by name, after the last refresh.
        controls: each schedule's row of widgets (:class:`ScheduleControls`), by name.
        widget: the root widget.
        status: the status line's last text.
    """

    def __init__(
        self,
        store: Store,
        browser: TaskBrowser | None = None,
        *,
        upcoming: int = 3,
        runs: int = 5,
    ) -> None:
        """Build the widgets; nothing is read until :meth:`refresh`.

        Args:
            store: an open store.
            browser: a TaskBrowser to show a schedule's runs in.
            upcoming: next fire times shown per schedule.
            runs: recent runs shown per schedule.
        """
        super().__init__()
        self.store = store
        self.browser = browser
        self.upcoming = upcoming
        self.runs = runs
        self.rows: list[ScheduleRow] = []
        self.controls: dict[str, ScheduleControls] = {}
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(lambda _: self._schedule(self.refresh()))
        self.rows_box = widgets.VBox()
        self.widget = widgets.VBox(
            [widgets.HTML(style_html()), self.refresh_button, self.rows_box, self.status_line]
        )
        self.widget.add_class("toolkit-schedule-board")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict) and "text/plain" in bundle:
            # Where widgets are not shown (a text export), the board as last refreshed.
            bundle["text/plain"] = f"ScheduleBoard (a live widget in JupyterLab)\n{self.listing()}"
        return bundle

    # --- scheduling -----------------------------------------------------------------------

    def _act(self, verb: str, name: str) -> None:
        """A row's button: schedule its coroutine."""
        if verb == "pause":
            note = self.controls[name].note.value.strip() or None
            self._schedule(self.pause(name, note))
        elif verb == "resume":
            self._schedule(self.resume(name))
        elif verb == "trigger":
            self._schedule(self.trigger(name))
        else:
            self._schedule(self.show_runs(name))

    # --- reading --------------------------------------------------------------------------

    async def refresh(self) -> list[ScheduleRow]:
        """Read every schedule, its next fire times and recent runs, and redraw the rows.

        Returns:
            The rows, by schedule name.
        """
        self.rows = await read_rows(self.store, upcoming=self.upcoming, runs=self.runs)
        names = {row.name for row in self.rows}
        for gone in set(self.controls) - names:
            self.controls.pop(gone).close()
        for row in self.rows:
            if row.name not in self.controls:
                self.controls[row.name] = ScheduleControls(row.name, self._act)
            self.controls[row.name].show(row, browser=self.browser is not None)
        self.rows_box.children = [self.controls[row.name].widget for row in self.rows]
        self._say(counted(len(self.rows), "schedule"))
        return self.rows

    def row(self, name: str) -> ScheduleRow:
        """The row of schedule ``name``, as last refreshed.

        Raises:
            UnknownSchedule: the board shows no schedule of that name (refresh first).
        """
        for row in self.rows:
            if row.name == name:
                return row
        raise UnknownSchedule(f"the board shows no schedule {name!r} (refresh it first)")

    def listing(self) -> str:
        """The board as plain text, a schedule after another, as last refreshed."""
        return rows_text(self.rows)

    # --- acting ---------------------------------------------------------------------------

    async def pause(self, name: str, note: str | None = None) -> Schedule:
        """Pause schedule ``name`` (``store.schedules.pause``), then refresh.

        Args:
            name: the schedule.
            note: why (shown on the board and by ``toolkit schedules list``).

        Raises:
            UnknownSchedule: there is none of that name.
        """
        schedule = await self.store.schedules.pause(name, note)
        await self.refresh()
        self._say(f"schedule {name} paused: {schedule.pause_note}")
        return schedule

    async def resume(self, name: str) -> Schedule:
        """Resume schedule ``name`` from its next tick after now, then refresh.

        Raises:
            UnknownSchedule: there is none of that name.
        """
        schedule = await self.store.schedules.resume(name)
        await self.refresh()
        row = self.row(name)
        self._say(f"schedule {name} resumed; next tick {row.moment(schedule.next_tick)}")
        return schedule

    async def trigger(self, name: str) -> int:
        """Start one run of schedule ``name`` now (even paused), then refresh.

        Returns:
            The task id of the run.

        Raises:
            UnknownSchedule: there is none of that name.
            InputError: its input no longer passes the definition's input schema.
        """
        task_id = await self.store.schedules.trigger(name)
        await self.refresh()
        self._say(f"schedule {name}: task {task_id} started")
        return task_id

    async def show_runs(self, name: str) -> list[TaskRecord]:
        """Set the browser's filter to the runs of schedule ``name`` (only), and refresh it.

        Returns:
            The runs the browser lists, newest first.

        Raises:
            ConfigError: the board was made without a browser.
        """
        if self.browser is None:
            raise ConfigError("no task browser: make the board with ScheduleBoard(store, browser)")
        self.browser.set_filters(schedule=name)
        runs = await self.browser.refresh()
        self._say(f"the task browser shows the runs of schedule {name}: {self.browser.status}")
        return runs
