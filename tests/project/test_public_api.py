"""The public surface: `toolkit.__all__` is exact, every error class is exported, and every
name the docs and tutorials use is pinned and imports."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import toolkit
from toolkit import errors


def test_all_names_exist_and_are_sorted() -> None:
    assert all(hasattr(toolkit, name) for name in toolkit.__all__)
    assert list(toolkit.__all__) == sorted(toolkit.__all__)


def test_every_error_a_user_catches_is_exported() -> None:
    internal = {"ExpressionSyntaxError", "NoChoiceMatched", "StoreError", "SchemaOutdated"}
    classes = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.ToolkitError)
    }
    missing = sorted(classes - set(toolkit.__all__) - internal)
    assert not missing, f"toolkit.__all__ lacks {missing}"


# --- what users import: pinned, so that moving a module is a deliberate, visible change ---------


ROOT = Path(__file__).resolve().parents[2]

#: ``toolkit.__all__``, exactly.
EXPORTS = [
    "App", "BudgetExceeded", "CallbackRefused", "CancellationToken", "ConcurrencyKeyBusy",
    "ConfigError",
    "DatabaseUnavailable", "DefinitionConflict", "DefinitionError", "DefinitionInUse",
    "DefinitionRetired", "EffectCancelled", "EffectContext", "ExpressionError",
    "HandlerArgumentsMismatch", "HandlerNotFound", "HistoryError", "InputError", "LeaseLost",
    "MissingHandlers", "MissingLimits", "NotExported", "NotReconcilable", "NotRedrivable",
    "PayloadRefused", "PlanRefused", "RedriveRefused", "ResultNotJson", "ResultTooLarge",
    "ScheduleConflict", "SignalAmbiguous",
    "Store", "SubmitConflict", "SupervisorConfig", "SupervisorReport", "TaskCancelled",
    "TaskFailed", "TaskFilter",
    "TaskTerminal", "Throttled", "ToolkitError", "UnknownDefinition", "UnknownLimit",
    "UnknownSignal",
    "UnknownTask", "UnknownTenant", "WaitTimedOut", "Worker", "WorkerIdInUse",
    "WorkflowDefinition", "WorkflowSupervisor", "load_definition", "load_definitions",
    "parse_definition", "start_embedded", "stop_embedded",
]  # fmt: skip

#: Every dotted name the docs (API reference included), the README and the tutorials import
#: or name. A module that moves keeps these working (a re-export) or the docs change with it.
DOCUMENTED = [
    "toolkit",
    "toolkit.__all__",
    "toolkit.definition",
    "toolkit.definition.cadence",
    "toolkit.definition.diagram",
    "toolkit.definition.diagram.mermaid",
    "toolkit.definition.diagram.step_kind",
    "toolkit.definition.flow_overrides.FlowOverrides",
    "toolkit.definition.schema_path",
    "toolkit.definition.svg",
    "toolkit.definition.svg.STATUS_COLOURS",
    "toolkit.definition.svg.svg",
    "toolkit.definition.walk",
    "toolkit.engine",
    "toolkit.engine.interpreter",
    "toolkit.errors",
    "toolkit.errors.DefinitionFault",
    "toolkit.errors.EffectCancelled",
    "toolkit.errors.HistoryError",
    "toolkit.errors.NotExported",
    "toolkit.errors.NotReconcilable",
    "toolkit.errors.TaskTerminal",
    "toolkit.examples",
    "toolkit.faults.fault_point",
    "toolkit.history",
    "toolkit.history.analytics",
    "toolkit.history.analytics.open",
    "toolkit.history.audit",
    "toolkit.history.audit.AuditReport",
    "toolkit.history.audit.Violation",
    "toolkit.history.audit.audit_all",
    "toolkit.history.audit.audit_task",
    "toolkit.history.export",
    "toolkit.history.export.EXPORT_COLUMNS",
    "toolkit.history.export.export_history",
    "toolkit.history.notebook",
    "toolkit.history.notebook.ScheduleBoard",
    "toolkit.history.notebook.ScheduleRow",
    "toolkit.history.notebook.ScratchDatabase",
    "toolkit.history.notebook.TaskBrowser",
    "toolkit.history.notebook.plot_history",
    "toolkit.history.open",
    "toolkit.history.retention",
    "toolkit.history.schedule_board",
    "toolkit.history.schedule_board.ScheduleBoard",
    "toolkit.history.schedule_view",
    "toolkit.history.schedule_view.ScheduleRow",
    "toolkit.history.scratch",
    "toolkit.history.scratch.ScratchDatabase",
    "toolkit.history.task_path",
    "toolkit.history.task_path.StepMark",
    "toolkit.history.task_path.task_path",
    "toolkit.history.task_path.top_step",
    "toolkit.ops.demo",
    "toolkit.ops.log_format.JsonFormatter",
    "toolkit.runtime.supervisor",
    "toolkit.store.bulk.Bulk",
    "toolkit.store.bulk.Plan",
    "toolkit.store.definitions.DefinitionCatalog",
    "toolkit.store.embedded",
    "toolkit.store.rotation",
    "toolkit.store.tasks.TaskRecord",
    "toolkit.store.tasks.Tasks",
    "toolkit.store.tenants.Budget",
    "toolkit.store.tenants.TenantRecord",
    "toolkit.store.tenants.Tenants",
    *(f"toolkit.{name}" for name in EXPORTS),
]

_REFERENCE = re.compile(r"::: (toolkit[\w.]*)|`(toolkit(?:\.\w+)+)")
_FROM_IMPORT = re.compile(r"^\s*from (toolkit[\w.]*) import \(?([\w, \n]+?)\)?\s*$", re.M)
_IMPORT = re.compile(r"^\s*import (toolkit[\w.]*)", re.M)


def documented_names() -> set[str]:
    """The dotted toolkit names the docs, the README and the tutorials use."""
    texts = [path.read_text() for path in [*ROOT.glob("docs/**/*.md"), ROOT / "README.md"]]
    for notebook in ROOT.glob("notebooks/*.ipynb"):
        cells = json.loads(notebook.read_text())["cells"]
        texts += ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    names: set[str] = set()
    for text in texts:
        names.update(a or b for a, b in _REFERENCE.findall(text))
        for module, imported in _FROM_IMPORT.findall(text):
            names.update(f"{module}.{n.strip()}" for n in imported.split(",") if n.strip())
        names.update(_IMPORT.findall(text))
    return names


def resolve(dotted: str) -> object:
    """The object a dotted name denotes: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_package_exports_exactly_the_pinned_names() -> None:
    assert list(toolkit.__all__) == EXPORTS


def test_every_documented_name_resolves() -> None:
    broken = []
    for name in DOCUMENTED:
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{name}: {exc}")
    assert not broken, "documented names that no longer import:\n" + "\n".join(broken)


def test_the_docs_and_tutorials_use_only_pinned_names() -> None:
    unpinned = sorted(documented_names() - set(DOCUMENTED))
    assert not unpinned, f"pin these in DOCUMENTED (or fix the docs): {unpinned}"
