"""The ``TaskBrowser``'s task list: a listbox widget the keyboard moves through.

An ipywidgets ``Select`` is a ``<select>``, whose arrow keys JupyterLab takes for its own
notebook shortcuts (a focused ``<select>`` does not count as editing); this list, an
anywidget with a few lines of JavaScript (``task_list.js``), tells JupyterLab to leave its
keys alone, so ArrowUp, ArrowDown, Home and End move the selection (issue 24, item 6).
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

HERE = Path(__file__).resolve().parent


class TaskList(anywidget.AnyWidget):
    """A list of tasks to pick one from, by mouse or keyboard.

    Attributes:
        options: ``(label, task id)`` pairs, in the order shown.
        value: the selected task id, or None.
        rows: the height of the list, in rows.
    """

    _esm = HERE / "task_list.js"
    _css = HERE / "task_list.css"
    options = traitlets.List(traitlets.Tuple(traitlets.Unicode(), traitlets.Int())).tag(
        sync=True
    )
    value = traitlets.Int(None, allow_none=True).tag(sync=True)
    rows = traitlets.Int(12).tag(sync=True)

    @traitlets.validate("value")
    def _known(self, proposal: traitlets.Bunch) -> int | None:
        value = proposal["value"]
        if value is not None and value not in {task_id for _, task_id in self.options}:
            raise traitlets.TraitError(f"task {value} is not in the list")
        return value  # type: ignore[no-any-return]
