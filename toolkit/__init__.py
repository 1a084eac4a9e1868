"""runifold: durable workflows declared as versioned YAML graphs, run against PostgreSQL.

The public names are re-exported here; everything else is internal and may change.
"""

from toolkit.definition import (
    WorkflowDefinition,
    load_definition,
    load_definitions,
    parse_definition,
)
from toolkit.embedded import start_embedded, stop_embedded
from toolkit.errors import (
    ConfigError,
    DatabaseUnavailable,
    DefinitionConflict,
    DefinitionError,
    DefinitionInUse,
    DefinitionRetired,
    EffectCancelled,
    ExpressionError,
    HandlerNotFound,
    HistoryError,
    InputError,
    LeaseLost,
    MissingHandlers,
    NotExported,
    NotReconcilable,
    PayloadRefused,
    ResultNotJson,
    ResultTooLarge,
    SubmitConflict,
    TaskTerminal,
    ToolkitError,
    UnknownDefinition,
    UnknownTask,
    UnknownTenant,
    WorkerIdInUse,
)
from toolkit.registry import App, EffectContext
from toolkit.store import Store
from toolkit.supervisor import (
    CancellationToken,
    SupervisorConfig,
    SupervisorReport,
    WorkflowSupervisor,
)
from toolkit.worker import Worker

__all__ = [
    "App",
    "CancellationToken",
    "ConfigError",
    "DatabaseUnavailable",
    "DefinitionConflict",
    "DefinitionError",
    "DefinitionInUse",
    "DefinitionRetired",
    "EffectCancelled",
    "EffectContext",
    "ExpressionError",
    "HandlerNotFound",
    "HistoryError",
    "InputError",
    "LeaseLost",
    "MissingHandlers",
    "NotExported",
    "NotReconcilable",
    "PayloadRefused",
    "ResultNotJson",
    "ResultTooLarge",
    "Store",
    "SubmitConflict",
    "SupervisorConfig",
    "SupervisorReport",
    "TaskTerminal",
    "ToolkitError",
    "UnknownDefinition",
    "UnknownTask",
    "UnknownTenant",
    "Worker",
    "WorkerIdInUse",
    "WorkflowDefinition",
    "WorkflowSupervisor",
    "load_definition",
    "load_definitions",
    "parse_definition",
    "start_embedded",
    "stop_embedded",
]
