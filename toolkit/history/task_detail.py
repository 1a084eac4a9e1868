"""One task as the browser shows it: fields, tables, as text or as HTML.

:class:`TaskDetail` gathers a task's row, events, evidence and signals, and the definition it
is pinned to; ``text()`` is what docs and tests compare, ``html()`` what the TaskBrowser's
detail pane shows. Both come from the same :meth:`TaskDetail.fields` and
:meth:`TaskDetail.tables`; the HTML adds the definition's drawing with the task's path
coloured (:attr:`TaskDetail.path`, `toolkit.history.task_path`).
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Sequence
from typing import Any

from toolkit.definition import WorkflowDefinition
from toolkit.definition.svg import svg
from toolkit.history.analytics import cell_text, render_table
from toolkit.history.task_path import StepMark, task_path
from toolkit.lifecycle import cursor_text, received_signal, received_text
from toolkit.store.branches import StoredBranch
from toolkit.store.streams import StreamEvent
from toolkit.store.tasks import TaskRecord


@dataclasses.dataclass(frozen=True)
class TaskDetail:
    """Everything the browser shows of one task.

    Attributes:
        task: the task row.
        events: its events (every transition), oldest first.
        evidence: its effect evidence records, oldest first.
        signals: the signals sent to it, oldest first.
        definition: the definition the task is pinned to, or None (not loaded, or no
            longer registered): the HTML then has no drawing.
        branches: the branches of its parallel or map step in progress (their rows).
        emitted: the events that started it, were delivered to it or cancelled it
            (``store.events.of_task``: ``id``, ``name``, ``emitted_at``, ``how``).
        stream: the newest items its handlers published (``ctx.publish``), oldest first.
    """

    task: TaskRecord
    events: list[dict[str, Any]]
    evidence: list[dict[str, Any]]
    signals: list[dict[str, Any]]
    definition: WorkflowDefinition | None = None
    branches: Sequence[StoredBranch] = ()
    emitted: Sequence[dict[str, Any]] = ()
    stream: Sequence[StreamEvent] = ()

    @property
    def path(self) -> dict[str, StepMark] | None:
        """What happened to each step of the definition in the task; None without it.

        Returns:
            Step id to its status and note (`toolkit.history.task_path.task_path`).
        """
        if self.definition is None:
            return None
        return task_path(self.task, self.events, self.evidence, self.definition)

    @property
    def wait(self) -> str | None:
        """What the task waits for, in words; None unless it is waiting."""
        if self.task.state != "waiting":
            return None
        wait = self.task.checkpoint.get("wait") or {}
        if self.task.wait_reason == "reconciliation":
            return f"reconciliation of {self.task.checkpoint.get('pending')}"
        received = received_signal(wait, self.signals)
        if received is not None:
            return received_text(received)
        if "signal" in wait:
            return f"signal {wait['signal']!r}"
        if "child" in wait:
            return f"child task {wait['child']}"
        if "branches" in wait:
            waiting = sum(
                branch.status == "waiting" and branch.fanout == wait["occurrence"]
                for branch in self.branches
            )
            return f"its waiting branches ({waiting} of {wait['occurrence']})"
        if isinstance(wait.get("map"), dict):
            tasks = wait["map"].get("tasks", 0)
            return f"the {tasks:,} child tasks of distributed map {wait['occurrence']}"
        return str(self.task.wait_reason)

    @property
    def reconciliation(self) -> str | None:
        """The uncertain effect to resolve, when the task waits for reconciliation."""
        if self.task.wait_reason != "reconciliation":
            return None
        pending = str(self.task.checkpoint.get("pending"))
        step = pending.rsplit("/", 1)[-1].split("#", 1)[0]
        return (
            f"step {step!r} ({pending}): intent recorded, outcome unknown; record what "
            "happened with reconcile (completed, failed or retry)"
        )

    def fields(self) -> list[tuple[str, str]]:
        """The task's fields as ``(label, value)`` pairs: state, claims, cursor, waits ..."""
        t = self.task
        found = [
            ("state", t.state + (f" ({t.wait_reason})" if t.wait_reason else "")),
            ("claims", f"{t.attempts}, fencing token {t.lease_token}"),
            ("cursor", cursor_text(t.checkpoint.get("cursor"), t.state)),
        ]
        if self.wait:
            found.append(("waits for", self.wait))
        if self.reconciliation:
            found.append(("reconcile", self.reconciliation))
        if t.result is not None:
            found.append(("result", json.dumps(t.result, default=str)))
        if t.error is not None:
            found.append(("error", json.dumps(t.error, default=str)))
        return found

    def tables(self, *, times: bool = False) -> list[tuple[str, list[str], list[list[Any]]]]:
        """``(title, columns, rows)`` of the evidence, the signals (if any) and the timeline.

        Args:
            times: a first column with the database times of the timeline's events.
        """
        evidence = [
            [e["occurrence"], e["record"], e["attempt"], e["fencing_token"], e["worker_id"]]
            for e in self.evidence
        ]
        columns = ["occurrence", "record", "attempt", "token", "worker"]
        found = [("effect evidence", columns, evidence)]
        signals = [
            [s["name"], "consumed" if s["consumed_at"] else "pending", json.dumps(s["payload"])]
            for s in self.signals
        ]
        if signals:
            found.append(("signals", ["name", "status", "payload"], signals))
        if self.emitted:
            emitted = [[e["id"], e["name"], e["how"]] for e in self.emitted]
            found.append(("events emitted", ["event", "name", "how"], emitted))
        if self.stream:
            items = [[i.seq, i.occurrence, json.dumps(i.value)] for i in self.stream]
            found.append(("stream", ["item", "published by", "value"], items))
        branches = [
            [b.address, b.status, b.frame.get("cursor") or "-", ", ".join(b.waits_for) or "-",
             b.run_at or "-"]
            for b in self.branches
        ]  # fmt: skip
        if branches:
            found.append(("branches", ["branch", "status", "at", "waits for", "until"], branches))
        columns = ["kind", "worker", "token", "detail"]  # of the timeline
        rows: list[list[Any]] = [
            [e["kind"], e["worker_id"] or "-", e["fencing_token"], _detail_text(e["detail"])]
            for e in self.events
        ]
        if times:
            columns.insert(0, "at")
            rows = [[e["at"], *row] for e, row in zip(self.events, rows, strict=True)]
        found.append(("timeline", columns, rows))
        return found

    def _title(self) -> str:
        t = self.task
        return f"task {t.id}: {t.definition_name} v{t.definition_version}, tenant {t.tenant}"

    def text(self, *, times: bool = False) -> str:
        """The task as plain text: its title, :meth:`fields`, then :meth:`tables`.

        Args:
            times: include the database times (off for stable output in docs and tests).
        """
        lines = [self._title()]
        lines += [f"  {label + ':':<11} {value}" for label, value in self.fields()]
        for title, columns, rows in self.tables(times=times):
            lines += render_table(title, columns, rows)
        return "\n".join(lines)

    def html(self) -> str:
        """The task as HTML tables, with times (what the browser's detail pane shows).

        The state is a coloured badge; with the definition, its drawing follows the fields,
        an inline SVG with each step coloured by :attr:`path` (a legend says the colours,
        a step's tooltip why); each evidence row is coloured by its record (completed,
        failed, or an intent without outcome yet).
        """
        esc = html.escape
        colour = STATE_COLOURS.get(self.task.state, "#616161")
        parts = [
            f'<div class="toolkit-task"><b>{esc(self._title())}</b> '
            f'<span style="background:{colour};color:white;padding:0 6px;border-radius:3px">'
            f"{esc(self.task.state)}</span>",
            _html_table([], [[label, value] for label, value in self.fields()], head=False),
        ]
        path = self.path
        if self.definition is not None and path is not None:
            drawing = svg(
                self.definition,
                {step: mark.status for step, mark in path.items()},
                {step: mark.note for step, mark in path.items()},
            )
            parts.append(
                "<div style='margin-top:6px'><b>path</b></div>"
                f"<div class='toolkit-task-path' style='overflow-x:auto'>{drawing}</div>"
            )
        for title, columns, rows in self.tables(times=True):
            shades = [_RECORD_SHADES.get(str(row[1]), "") for row in rows]
            parts.append(f"<div style='margin-top:6px'><b>{esc(title)}</b></div>")
            parts.append(_html_table(columns, rows, shades if title == "effect evidence" else []))
        parts.append("</div>")
        return "".join(parts)


#: The badge colour of each task state in the detail pane.
STATE_COLOURS = {
    "queued": "#757575", "leased": "#1565c0", "waiting": "#ef6c00",
    "succeeded": "#2e7d32", "failed": "#c62828", "cancelled": "#616161",
}  # fmt: skip
#: The row shade of each evidence record.
_RECORD_SHADES = {"completed": "#e8f5e9", "failed": "#ffebee", "started": "#fff8e1"}


def _html_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    shades: Sequence[str] = (),
    *,
    head: bool = True,
) -> str:
    """An HTML table of ``rows`` (escaped), each row shaded by ``shades`` when given."""
    cell = "padding:0 8px;line-height:1.4;text-align:left;font-family:monospace;vertical-align:top"
    out = ["<table style='border-collapse:collapse'>"]
    if head and columns:
        out.append("<tr>" + "".join(f"<th style='{cell}'>{html.escape(c)}</th>" for c in columns))
    for index, row in enumerate(rows):
        shade = shades[index] if index < len(shades) and shades[index] else ""
        style = f" style='background:{shade}'" if shade else ""
        last = len(row) - 1  # the others keep to one line; the last (details) wraps
        cells = "".join(
            f"<td style='{cell}{'' if i == last else ';white-space:nowrap'}'>"
            f"{html.escape(cell_text(value))}</td>"
            for i, value in enumerate(row)
        )
        out.append(f"<tr{style}>{cells}</tr>")
    if not rows and head:
        out.append(f"<tr><td style='{cell}' colspan='{len(columns)}'>(none)</td></tr>")
    out.append("</table>")
    return "".join(out)


def _detail_text(detail: dict[str, Any] | None) -> str:
    """An event's detail for the timeline, without its timing (``queue_delay``), short."""
    shown = {key: value for key, value in (detail or {}).items() if key != "queue_delay"}
    return json.dumps(shown, default=str)[:60] if shown else ""
