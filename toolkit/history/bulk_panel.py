"""The TaskBrowser's bulk actions: preview a plan on the current filter, then apply it.

The same plans as ``toolkit bulk`` (docs/many-tasks.md): the preview shows how many tasks
match, by state and definition, and what the action would do; applying the plan acts only
on tasks whose fencing token and state are still those the preview showed.
"""

from __future__ import annotations

import html
import json
from collections.abc import Awaitable, Callable
from typing import Any

import ipywidgets as widgets

from toolkit.errors import ConfigError
from toolkit.store import Store
from toolkit.store.bulk import Plan
from toolkit.store.filters import TaskFilter


class BulkPanel:
    """Preview and apply a bulk cancel or signal on a filter.

    Args:
        store: the store.
        where: gives the filter to act on (the browser's current one).
        operator: the name recorded with plans and their events.
        applied: awaited after a plan is applied (the browser refreshes).
        say: shows a status line.

    Attributes:
        plan: the last plan previewed (or applied), None before the first preview.
        widget: the panel.
    """

    def __init__(
        self,
        store: Store,
        where: Callable[[], TaskFilter],
        operator: str,
        applied: Callable[[], Awaitable[object]],
        say: Callable[[str], None],
    ) -> None:
        self.store = store
        self.plan: Plan | None = None
        self._where = where
        self._operator = operator
        self._applied = applied
        self._say = say
        self.action = widgets.ToggleButtons(options=["cancel", "signal"], value="cancel")
        self.signal_name = widgets.Text(description="signal", placeholder="name")
        self.signal_payload = widgets.Text(description="payload", placeholder="JSON (optional)")
        self.reason = widgets.Text(description="reason", value="cancelled in bulk")
        self.preview_button = widgets.Button(description="Preview", icon="eye")
        self.apply_button = widgets.Button(
            description="Apply plan", icon="check", button_style="warning", disabled=True
        )
        self.preview_pane = widgets.HTML()
        self.widget = widgets.VBox([
            widgets.HTML("<b>On every task the filter matches</b>"),
            widgets.HBox([self.action, self.preview_button, self.apply_button]),
            widgets.HBox([self.signal_name, self.signal_payload, self.reason]),
            self.preview_pane,
        ])  # fmt: skip

    async def preview(
        self,
        action: str,
        *,
        name: str | None = None,
        payload: Any = None,
        reason: str = "cancelled in bulk",
    ) -> Plan:
        """Make a plan of ``action`` on the current filter and show what it would do.

        Args:
            action: ``cancel`` or ``signal``.
            name: the signal's name (``signal``).
            payload: the signal's payload.
            reason: the cancellation's reason (``cancel``).

        Returns:
            The plan, kept in the store until applied.

        Raises:
            ConfigError: an unknown action, or a signal without a name.
            UnknownSignal, InputError: as ``store.bulk.plan_signal`` raises them.
        """
        where = self._where()
        if action == "cancel":
            plan = await self.store.bulk.plan_cancel(where, reason=reason, operator=self._operator)
        elif action == "signal":
            if not name:
                raise ConfigError("give the signal a name")
            plan = await self.store.bulk.plan_signal(where, name, payload, operator=self._operator)
        else:
            raise ConfigError(f"a bulk action is cancel or signal, not {action!r}")
        self.plan = plan
        self.preview_pane.value = _plan_html(plan, where)
        self.apply_button.disabled = plan.planned == 0
        self._say(f"plan {plan.id}: {plan.planned:,} tasks; apply it to carry it out")
        return plan

    async def apply(self) -> Plan:
        """Apply the plan last previewed; then the browser refreshes.

        Returns:
            The plan as applied.

        Raises:
            ConfigError: nothing was previewed.
            PlanRefused: it was applied already.
        """
        if self.plan is None:
            raise ConfigError("preview a bulk action first")
        plan = await self.store.bulk.apply(self.plan.id)
        self.plan = plan
        self.apply_button.disabled = True
        self.preview_pane.value = (
            f"<div>plan {plan.id} applied: {html.escape(plan.summary())}</div>"
        )
        await self._applied()
        self._say(f"plan {plan.id} applied: {plan.summary()}")
        return plan

    async def preview_from_widgets(self) -> None:
        """The Preview button."""
        text = self.signal_payload.value.strip()
        try:
            payload = json.loads(text) if text else None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"payload: not valid JSON: {exc}") from None
        await self.preview(
            str(self.action.value),
            name=self.signal_name.value.strip() or None,
            payload=payload,
            reason=self.reason.value or "cancelled in bulk",
        )


def _plan_html(plan: Plan, where: TaskFilter) -> str:
    """The preview: the matching tasks by state and definition, and what the action does."""
    esc = html.escape
    matched = sum(n for *_, n in plan.matched)
    cell = "padding:0 8px;text-align:left;font-family:monospace"
    rows = "".join(
        f"<tr><td style='{cell}'>{esc(state)}</td><td style='{cell}'>{esc(name)} v{version}"
        f"</td><td style='{cell};text-align:right'>{n:,}</td></tr>"
        for state, name, version, n in plan.matched
    )
    effects = "".join(f"<li>{esc(line)}</li>" for line in plan.effects())
    return (
        f"<div><b>{matched:,} tasks match</b> ({esc(where.describe())})"
        f"<table style='border-collapse:collapse'>{rows}</table>"
        f"{esc(plan.action)} would act on {plan.planned:,} of them:<ul>{effects}</ul>"
        f"plan {plan.id}: applying it touches only tasks whose fencing token and state are "
        "still those shown.</div>"
    )
