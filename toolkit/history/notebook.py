"""Notebook inspection: a task browser, a schedule board, a history dashboard, a scratch database.

The task browser and the schedule board (:mod:`toolkit.history.schedule_board`) are built
with ipywidgets, the dashboard with matplotlib; the scratch database
(:mod:`toolkit.history.scratch`) gives a tutorial its own PostgreSQL.

Everything here is async-friendly in Jupyter's running event loop: call the coroutine
methods with top-level ``await`` in a cell; widget buttons schedule their work on that same
loop. Nothing here calls ``anyio.run`` or ``asyncio.run``.

Needs the ``notebook`` extra (``pip install "runifold[notebook]"``: ipywidgets, matplotlib).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from toolkit.counts import counted
from toolkit.definition import WorkflowDefinition
from toolkit.errors import ConfigError, DefinitionError, UnknownDefinition
from toolkit.history.analytics import History, render_table
from toolkit.history.bulk_panel import BulkPanel
from toolkit.history.filter_bar import FilterBar
from toolkit.history.live_view import LiveView
from toolkit.history.redrive_panel import RedrivePanel
from toolkit.history.schedule_board import ScheduleBoard as ScheduleBoard
from toolkit.history.schedule_view import ScheduleRow as ScheduleRow
from toolkit.history.scratch import ScratchDatabase as ScratchDatabase  # its place in 0.x
from toolkit.history.task_detail import TaskDetail as TaskDetail
from toolkit.history.task_list import TaskList
from toolkit.history.widget_work import WidgetWork
from toolkit.lifecycle import TaskState
from toolkit.store import Store
from toolkit.store.tasks import TaskRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure



# --- the task browser -------------------------------------------------------------------------

#: The newest stream items the detail pane shows.
STREAM_SHOWN = 20


class TaskBrowser(WidgetWork):
    """An ipywidgets view of the tasks of a store: filter, open one, act on it.

    Filter by state, tenant, definition, version, tags, error, schedule and submit time
    (the fields of a :class:`~toolkit.store.filters.TaskFilter`), page through any number
    of tasks (``limit`` a page), preview and apply a bulk cancel or signal on the filter
    (``bulk``, the plans of ``toolkit bulk``); open a task to see its timeline of events,
    checkpoint, effect evidence, waits, signals and reconciliation status, and its
    path through its definition's graph (an SVG, each step coloured by what happened to
    it); send it a signal, cancel it or reconcile it with the buttons, which call the same
    store API as ``toolkit signal``, ``toolkit cancel`` and ``toolkit reconcile``; preview
    and apply the redrive of a failed or cancelled one (``redrive``, as ``toolkit redrive``).

    Use it in a notebook cell::

        browser = TaskBrowser(store)
        await browser.refresh()
        browser          # displays the widget

    The coroutine methods (:meth:`refresh`, :meth:`open`, :meth:`signal`, :meth:`cancel`,
    :meth:`reconcile`) are the API behind the widgets; call them with ``await``. A button
    or filter change schedules its coroutine on the running event loop; :meth:`settle`
    waits for what was scheduled. Errors show in the status line, not as tracebacks.

    Attributes:
        store: the store browsed.
        tasks: the tasks the list shows (newest first), after the last refresh.
        total: how many tasks the filter matches, after the last refresh.
        filters: the filter widgets (:class:`~toolkit.history.filter_bar.FilterBar`).
        bulk: the bulk actions (:class:`~toolkit.history.bulk_panel.BulkPanel`).
        redrive: the open task's redrive
            (:class:`~toolkit.history.redrive_panel.RedrivePanel`).
        detail: the open task, or None.
        live: the live view of the open task while it has not ended
            (:class:`~toolkit.history.live_view.LiveView`).
        widget: the root widget.
        status: the status line's last text.
    """

    def __init__(self, store: Store, *, limit: int = 100, operator: str = "notebook") -> None:
        """Build the widgets; nothing is read until :meth:`refresh`.

        Args:
            store: an open store.
            limit: tasks on a page.
            operator: the name recorded with reconciliations and bulk plans.
        """
        super().__init__()
        self.store = store
        self.limit = limit
        self.operator = operator
        self.tasks: list[TaskRecord] = []
        self.detail: TaskDetail | None = None
        #: The task last asked for by ``open``: a render of any other (a live render that was
        #: in flight when another task was opened) is dropped.
        self._opened: int | None = None
        self._definitions: dict[tuple[str, int, str], WorkflowDefinition] = {}
        self._updating = False

        self.filters = FilterBar(changed=lambda: self._schedule(self.refresh()))
        #: The ``before`` id of each page shown so far (None: the newest); the last is shown.
        self._pages: list[int | None] = [None]
        self.total = 0
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.newer_button = widgets.Button(description="Newer", icon="arrow-left", disabled=True)
        self.older_button = widgets.Button(description="Older", icon="arrow-right", disabled=True)
        self.task_list = TaskList(rows=12, layout=widgets.Layout(width="100%"))
        self.detail_pane = widgets.HTML()
        self.signal_name = widgets.Text(description="signal", placeholder="name")
        self.signal_payload = widgets.Text(description="payload", placeholder="JSON (optional)")
        self.signal_button = widgets.Button(description="Send signal", icon="paper-plane")
        self.cancel_reason = widgets.Text(description="reason", value="cancelled in a notebook")
        self.cancel_button = widgets.Button(
            description="Cancel task", icon="ban", button_style="warning"
        )
        self.reconcile_step = widgets.Text(description="step")
        self.reconcile_outcome = widgets.ToggleButtons(
            options=["completed", "failed", "retry"], value="completed"
        )
        self.reconcile_result = widgets.Text(description="result", placeholder="JSON (completed)")
        self.reconcile_error = widgets.Text(description="error", placeholder="name (failed)")
        self.reconcile_button = widgets.Button(description="Reconcile", icon="check")

        self.bulk = BulkPanel(
            store, lambda: self.filters.where, operator, self._reload, self._say
        )
        self.redrive = RedrivePanel(store, self._open_id, operator, self._after_action)
        self.live = LiveView(store, self._show)
        self.refresh_button.on_click(lambda _: self._schedule(self.refresh()))
        self.newer_button.on_click(lambda _: self._schedule(self.previous_page()))
        self.older_button.on_click(lambda _: self._schedule(self.next_page()))
        bulk = self.bulk
        bulk.preview_button.on_click(lambda _: self._schedule(bulk.preview_from_widgets()))
        bulk.apply_button.on_click(lambda _: self._schedule(bulk.apply()))
        self.task_list.observe(self._on_select, names="value")
        self.signal_button.on_click(lambda _: self._schedule(self._signal_from_widgets()))
        self.cancel_button.on_click(lambda _: self._schedule(self._cancel_from_widgets()))
        self.reconcile_button.on_click(lambda _: self._schedule(self._reconcile_from_widgets()))
        redrive = self.redrive
        redrive.preview_button.on_click(lambda _: self._schedule(redrive.preview_from_widgets()))
        redrive.apply_button.on_click(lambda _: self._schedule(redrive.apply_from_widgets()))

        actions = widgets.VBox(
            [
                widgets.HBox([self.signal_name, self.signal_payload, self.signal_button]),
                widgets.HBox([self.cancel_reason, self.cancel_button]),
                widgets.HBox([self.reconcile_step, self.reconcile_outcome]),
                widgets.HBox([self.reconcile_result, self.reconcile_error, self.reconcile_button]),
                self.redrive.widget,
            ]
        )
        self.widget = widgets.VBox(
            [
                self.filters.widget,
                widgets.HBox([self.refresh_button, self.newer_button, self.older_button]),
                self.task_list,
                self.detail_pane,
                self.live.line,
                actions,
                widgets.Accordion([self.bulk.widget], titles=("Bulk actions on the filter",)),
                self.status_line,
            ]
        )  # fmt: skip

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict) and "text/plain" in bundle:
            # Shown where widgets are not (a notebook opened before it runs, a text export):
            # a sentence, not the widget tree's repr.
            bundle["text/plain"] = (
                "TaskBrowser: a live widget; run the notebook in JupyterLab to use it"
            )
        return bundle

    # --- filters and the list -------------------------------------------------------------

    def _on_select(self, change: dict[str, Any]) -> None:
        if not self._updating and change["new"] is not None:
            self._schedule(self.open(int(change["new"])))

    def set_filters(self, **fields: Any) -> None:
        """Set the filter (None: any) without refreshing; then ``await refresh()``.

        Args:
            fields: :class:`~toolkit.store.filters.TaskFilter` fields: ``state``, ``tenant``,
                ``definition`` (a name) and ``version`` (the dropdowns), ``tags``, ``error``,
                ``schedule`` and ``created_since`` (the text fields), or any other (``step``
                ...).

        Raises:
            ValueError: a value a dropdown does not offer (refresh first to load the
                tenants, definitions and versions), or no such field.
        """
        self.filters.set(**fields)

    async def refresh(self) -> list[TaskRecord]:
        """Reload the filter choices and the newest page of tasks the filter matches.

        Returns:
            The tasks listed (newest first, at most ``limit``).

        Raises:
            ConfigError: a filter text field does not parse.
        """
        self._pages = [None]
        return await self._reload()

    async def next_page(self) -> list[TaskRecord]:
        """Show the next (older) page of the tasks the filter matches."""
        if self.tasks:
            self._pages.append(self.tasks[-1].id)
        return await self._reload()

    async def previous_page(self) -> list[TaskRecord]:
        """Show the previous (newer) page."""
        if len(self._pages) > 1:
            self._pages.pop()
        return await self._reload()

    async def _reload(self) -> list[TaskRecord]:
        """Read the page shown (``_pages[-1]``) again, and the filter's choices."""
        where = self.filters.where
        everything = await self.store.tasks.list(limit=self.limit * 10)
        self.tasks = await self.store.tasks.list(where, before=self._pages[-1], limit=self.limit)
        self.total = await self.store.tasks.count(where)
        self._updating = True
        try:
            self.filters.offer(everything)
            self.task_list.options = [(self._label(r), r.id) for r in self.tasks]
            if self.detail is not None and self.detail.task.id in {r.id for r in self.tasks}:
                self.task_list.value = self.detail.task.id
            else:
                self.task_list.value = None
        finally:
            self._updating = False
        first = sum(1 for _ in self._pages[1:]) * self.limit
        self.newer_button.disabled = first == 0
        self.older_button.disabled = first + len(self.tasks) >= self.total
        if first:
            shown = f"tasks {first + 1:,} to {first + len(self.tasks):,} of {self.total:,}"
        else:
            shown = counted(len(self.tasks), "task")
            if self.total > len(self.tasks):
                shown += f" (the newest) of {self.total:,}"
        self._say(shown)
        return self.tasks

    @staticmethod
    def _label(record: TaskRecord) -> str:
        wait = f" ({record.wait_reason})" if record.wait_reason else ""
        return (
            f"{record.id:>6}  {record.state}{wait}  {record.definition_name} "
            f"v{record.definition_version}  {record.tenant}"
        )

    def listing(self) -> str:
        """The task list as plain text (id, state, definition, tenant), as last refreshed."""
        rows = [
            [r.id, r.state + (f" ({r.wait_reason})" if r.wait_reason else ""),
             f"{r.definition_name} v{r.definition_version}", r.tenant]
            for r in self.tasks
        ]  # fmt: skip
        return "\n".join(render_table("tasks", ["id", "state", "definition", "tenant"], rows))

    # --- one task ---------------------------------------------------------------------------

    async def open(self, task_id: int) -> TaskDetail:
        """Load one task into the detail pane, with the definition it is pinned to.

        While the task has not ended, the pane stays current without Refresh (the live
        view, :class:`~toolkit.history.live_view.LiveView`): its state changes and the items
        its handlers publish show as they happen, its progress on the line below.

        Returns:
            The task's detail (its ``definition`` None when that version is no longer
            registered).

        Raises:
            UnknownTask: no task has that id.
        """
        self._opened = task_id
        detail = await self._show(task_id)
        if TaskState(detail.task.state).terminal:
            self.live.stop()
        else:
            self.live.follow(task_id, after=detail.task.stream_seq)
        return detail

    async def _show(self, task_id: int) -> TaskDetail:
        """Read the task and show it in the detail pane (what ``open`` and the live view do).

        A task other than the one last opened is read but not shown: the live view's render
        of the task open before may finish after another was opened, and must not replace it
        (nor forget the redrive preview made meanwhile).
        """
        task = await self.store.tasks.get(task_id)
        detail = TaskDetail(
            task=task,
            events=await self.store.tasks.events(task_id),
            evidence=await self.store.tasks.evidence(task_id),
            signals=await self.store.tasks.signals(task_id),
            definition=await self._definition(task),
            branches=await self.store.branches.of_task(task_id),
            emitted=await self.store.events.of_task(task_id),
            stream=await self.store.streams.items(
                task_id, after=max(0, task.stream_seq - STREAM_SHOWN)
            ),
        )
        if task_id != self._opened:
            return detail
        self.detail = detail
        self.detail_pane.value = detail.html()
        # Offer only what the task can take: an ended task no signal nor cancel, and only a
        # task waiting for reconciliation a reconciliation.
        ended = TaskState(detail.task.state).terminal
        self.signal_button.disabled = self.cancel_button.disabled = ended
        self.reconcile_button.disabled = detail.task.wait_reason != "reconciliation"
        self.redrive.offer(detail.task.state in ("failed", "cancelled"))
        pending = detail.task.checkpoint.get("pending")
        if detail.task.wait_reason == "reconciliation" and pending:
            self.reconcile_step.value = str(pending).rsplit("/", 1)[-1].split("#", 1)[0]
        wait = detail.task.checkpoint.get("wait") or {}
        if detail.task.wait_reason == "signal" and "signal" in wait:
            self.signal_name.value = str(wait["signal"])
        if self.task_list.value != task_id and task_id in {r.id for r in self.tasks}:
            self._updating = True
            try:
                self.task_list.value = task_id
            finally:
                self._updating = False
        return detail

    async def _definition(self, task: TaskRecord) -> WorkflowDefinition | None:
        """The definition the task is pinned to (name, version and digest), or None.

        None when that version is no longer registered (deleted once its tasks ended) or
        its stored body no longer loads: the detail then shows no drawing.
        """
        key = (task.definition_name, task.definition_version, task.definition_digest)
        if key not in self._definitions:
            try:
                found = await self.store.definitions.get(key[0], key[1])
            except (UnknownDefinition, DefinitionError):
                return None
            if found.digest != task.definition_digest:
                return None
            self._definitions[key] = found  # a registered version never changes
        return self._definitions[key]

    def _open_id(self) -> int:
        if self.detail is None:
            raise ConfigError("open a task first")
        return self.detail.task.id

    async def _after_action(self, message: str) -> None:
        task_id = self._open_id()
        await self.refresh()
        await self.open(task_id)
        self._say(message)

    async def signal(self, name: str, payload: Any = None) -> int:
        """Send signal ``name`` to the open task (``store.tasks.signal``), then reload.

        Returns:
            The signal's id.

        Raises:
            ConfigError: no task is open.
            TaskTerminal: the task has ended.
            InputError: the payload is not storable JSON.
        """
        task_id = self._open_id()
        signal_id = await self.store.tasks.signal(task_id, name, payload)
        await self._after_action(f"signal {signal_id} ({name}) sent to task {task_id}")
        return signal_id

    async def cancel(self, reason: str = "cancelled in a notebook") -> str:
        """Cancel the open task (``store.tasks.cancel``), then reload.

        Returns:
            ``"cancelled"`` or ``"requested"`` (a leased task stops at its next heartbeat).

        Raises:
            ConfigError: no task is open.
            TaskTerminal: the task has already ended.
        """
        task_id = self._open_id()
        outcome = await self.store.tasks.cancel(task_id, reason)
        await self._after_action(
            f"task {task_id} cancelled"
            if outcome == "cancelled"
            else f"task {task_id}: cancel requested; its worker stops it at its next heartbeat"
        )
        return outcome

    async def reconcile(
        self,
        step: str,
        outcome: str,
        *,
        result: Any = None,
        error: str | None = None,
        message: str | None = None,
    ) -> None:
        """Record the real outcome of the open task's uncertain effect, then reload.

        Calls ``store.tasks.reconcile``, as ``toolkit reconcile`` does.

        Args:
            step: the step waiting for reconciliation.
            outcome: ``completed``, ``failed`` or ``retry``.
            result: with ``completed``, the effect's result.
            error: with ``failed``, the error name retry and catch rules match.
            message: with ``failed``, a description.

        Raises:
            ConfigError: no task is open, or ``outcome`` is not one of the three.
            NotReconcilable: the task does not wait for reconciliation of ``step``.
        """
        if outcome not in ("completed", "failed", "retry"):
            raise ConfigError(f"outcome must be completed, failed or retry, not {outcome!r}")
        task_id = self._open_id()
        await self.store.tasks.reconcile(
            task_id, step, outcome,  # type: ignore[arg-type]
            result=result, error=error, message=message, operator=self.operator,
        )  # fmt: skip
        await self._after_action(f"task {task_id}: step {step} reconciled as {outcome}")

    # --- the buttons ------------------------------------------------------------------------

    @staticmethod
    def _json(text: str, what: str) -> Any:
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{what}: not valid JSON: {exc}") from None

    async def _signal_from_widgets(self) -> None:
        name = self.signal_name.value.strip()
        if not name:
            raise ConfigError("give the signal a name")
        await self.signal(name, self._json(self.signal_payload.value, "payload"))

    async def _cancel_from_widgets(self) -> None:
        await self.cancel(self.cancel_reason.value or "cancelled in a notebook")

    async def _reconcile_from_widgets(self) -> None:
        outcome = str(self.reconcile_outcome.value)
        await self.reconcile(
            self.reconcile_step.value.strip(),
            outcome,
            result=self._json(self.reconcile_result.value, "result")
            if outcome == "completed"
            else None,
            error=(self.reconcile_error.value.strip() or None) if outcome == "failed" else None,
        )


# --- the history dashboard --------------------------------------------------------------------


def plot_history(
    history: History, bucket: float | str = 60, *, title: str | None = None
) -> Figure:
    """Plot queue delay, throughput and failures over time from an export.

    Args:
        history: an open history (`toolkit.history.open`).
        bucket: time bucket, seconds or a duration string.
        title: the figure's title; default ``task history``.

    Returns:
        A matplotlib figure with three panels sharing the time axis: queue delay p50 and
        p95 (seconds), tasks ended per bucket (succeeded, failed, cancelled), and failed
        tasks per definition; the counts on whole-number ticks, each panel's legend to its
        right, clear of the data. Display it with ``display(fig)`` or as a cell's value.

    Raises:
        HistoryError: ``bucket`` is not a positive duration.
    """
    from matplotlib.axes import Axes
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    def series(rows: Sequence[Sequence[Any]], key: int, value: int) -> dict[Any, float]:
        out: dict[Any, float] = {}
        for row in rows:
            if row[value] is not None:
                out[row[key]] = out.get(row[key], 0.0) + float(row[value])
        return out

    def legend(axes: Axes) -> None:  # beside the panel: inside it, it covers the first bars
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)

    delay_rows = history.queue_delay_over_time(bucket).fetchall()
    ended = history.throughput(bucket).fetchall()

    width = _bucket_seconds(bucket) / 86400 * 0.8  # bar width in days, matplotlib's unit
    figure = Figure(figsize=(9, 7), layout="constrained")
    axes = figure.subplots(3, 1, sharex=True)
    p50, p95 = series(delay_rows, 0, 2), series(delay_rows, 0, 3)
    axes[0].plot(list(p50), list(p50.values()), marker="o", label="p50")
    axes[0].plot(list(p95), list(p95.values()), marker="o", label="p95")
    axes[0].set_ylabel("queue delay (s)")
    legend(axes[0])
    buckets = sorted({row[0] for row in ended})
    bottom = [0.0] * len(buckets)
    for column, label in ((5, "succeeded"), (6, "failed"), (7, "cancelled")):
        points = series(ended, 0, column)
        heights = [points.get(b, 0.0) for b in buckets]
        axes[1].bar(buckets, heights, width=width, bottom=bottom, label=label, align="edge")
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes[1].set_ylabel("tasks ended")
    legend(axes[1])
    names = sorted({row[1] for row in ended})
    for name in names:
        points = series([row for row in ended if row[1] == name], 0, 6)
        axes[2].plot(list(points), list(points.values()), marker="x", label=name)
    axes[2].set_ylabel("failed tasks")
    axes[2].set_xlabel("time (UTC)")
    for counts in axes[1:]:  # tasks are counted in whole numbers: no 0.5 ticks
        counts.yaxis.set_major_locator(MaxNLocator(integer=True))
    # Ticks a few seconds apart repeated "%H:%M:%S" labels; the concise formatter shows
    # fractions of seconds when the ticks need them, and the date once, at the axis' end.
    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    axes[2].xaxis.set_major_locator(locator)
    axes[2].xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    if names:
        legend(axes[2])
    figure.suptitle("task history" if title is None else title)
    return figure


def _bucket_seconds(bucket: float | str) -> float:
    from toolkit.history.analytics import _seconds

    return _seconds(bucket)
