"""The TaskBrowser's Redrive: preview the redrive of the open task, then apply that preview.

The same redrive as ``toolkit redrive`` (docs/effects.md, "Redrive"): the preview lists the
effects called again, those whose recorded results are kept, those refused and those sent
to reconciliation; *Redrive task* applies only while the task's fencing token is still the one
the preview showed, so it never acts on a task that changed after the operator read it.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable

import ipywidgets as widgets

from toolkit.errors import ConfigError
from toolkit.store import Store
from toolkit.store.redrive_plan import RedrivePlan


class RedrivePanel:
    """Preview and apply the redrive of one failed or cancelled task.

    Args:
        store: the store.
        task_id: gives the open task's id (raises ConfigError when none is open).
        operator: the name recorded in the ``redriven`` event.
        redriven: awaited after a redrive applied (the browser reloads the task).

    Attributes:
        plan: the last preview, None before one (or once the task changed).
        widget: the panel: step, reruns and reason fields, Preview and Redrive buttons.
    """

    def __init__(
        self,
        store: Store,
        task_id: Callable[[], int],
        operator: str,
        redriven: Callable[[str], Awaitable[object]],
    ) -> None:
        self.store = store
        self.plan: RedrivePlan | None = None
        #: The options the last preview was made with (``from_step``, ``rerun``).
        self._asked: tuple[str | None, tuple[str, ...]] = (None, ())
        self._task_id = task_id
        self._operator = operator
        self._redriven = redriven
        self.from_step = widgets.Text(description="from", placeholder="step (optional)")
        self.rerun = widgets.Text(description="rerun", placeholder="steps, comma-separated")
        self.reason = widgets.Text(description="reason", value="redriven in a notebook")
        self.preview_button = widgets.Button(
            description="Preview redrive", icon="eye", disabled=True
        )
        self.apply_button = widgets.Button(
            description="Redrive task", icon="repeat", button_style="warning", disabled=True
        )
        self.preview_pane = widgets.HTML()
        self.widget = widgets.VBox([
            widgets.HBox([self.from_step, self.rerun, self.reason]),
            widgets.HBox([self.preview_button, self.apply_button]),
            self.preview_pane,
        ])  # fmt: skip

    def offer(self, redrivable: bool) -> None:
        """A task was opened: forget the last preview; offer a preview if it can be redriven."""
        self.plan = None
        self.preview_pane.value = ""
        self.preview_button.disabled = not redrivable
        self.apply_button.disabled = True

    async def preview(
        self, *, from_step: str | None = None, rerun: tuple[str, ...] = ()
    ) -> RedrivePlan:
        """Plan the redrive of the open task, writing nothing, and show what it would do.

        Args:
            from_step: resume at this step (``--from``); None: where it failed.
            rerun: non-idempotent steps that may be called again (``--rerun``).

        Returns:
            The plan; *Redrive task* applies it while the task's token is still ``plan.token``.

        Raises:
            ConfigError: no task is open.
            NotRedrivable: the task cannot be redriven as asked (the message says why).
        """
        found = await self.store.tasks.redrive(
            self._task_id(), from_step=from_step, rerun=rerun, dry_run=True
        )
        self.plan, self._asked = found, (from_step, rerun)
        lines = "\n".join(found.lines())
        verdict = (
            "refused: change the options and preview again" if found.refused
            else "Redrive applies this while the task is unchanged"
        )  # fmt: skip
        self.preview_pane.value = (
            f"<pre style='margin:4px 0'>{html.escape(lines)}</pre><div>{verdict}</div>"
        )
        self.apply_button.disabled = found.refused
        return found

    async def apply(self, reason: str | None = None) -> RedrivePlan:
        """Redrive the open task as the last preview showed, then reload it.

        Args:
            reason: why, recorded in the ``redriven`` event.

        Returns:
            The plan applied.

        Raises:
            ConfigError: nothing was previewed.
            NotRedrivable: the task changed since the preview.
            RedriveRefused: the preview was refused.
        """
        shown = self.plan
        if shown is None:
            raise ConfigError("preview the redrive first")
        self.apply_button.disabled = True
        from_step, rerun = self._asked
        found = await self.store.tasks.redrive(
            shown.task_id, from_step=from_step, rerun=rerun, token=shown.token, reason=reason,
            operator=self._operator,
        )  # fmt: skip
        self.plan = None
        await self._redriven(f"task {found.task_id} redriven at step {found.resume!r}; queued")
        return found

    async def preview_from_widgets(self) -> None:
        """The Preview redrive button."""
        reruns = tuple(step.strip() for step in self.rerun.value.split(",") if step.strip())
        await self.preview(from_step=self.from_step.value.strip() or None, rerun=reruns)

    async def apply_from_widgets(self) -> None:
        """The Redrive task button."""
        await self.apply(self.reason.value.strip() or None)

