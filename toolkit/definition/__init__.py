"""Workflow definitions: the YAML format, its checks and expressions (DESIGN §3).

The model: ``model`` holds the validated definition and its steps, ``policies`` the retry
policies and catch rules of a failing step and the rule of the error names they match.
Loading: ``load`` parses, checks and loads definitions, ``build`` turns a checked document
into the model, ``yaml_source`` is the safe loader that knows each value's line. The faults
found beyond the JSON Schema: ``semantic`` runs them all (on the document and in each
branch), ``schema_faults`` words the schema's errors, ``graph`` checks targets, reachability
and termination, ``step_checks`` the steps' fields, ``references`` the expressions and the
names they read, ``input_schema`` the JSON Schemas a definition declares; ``wording`` is how
messages are written. ``payloads`` checks task input and signal payloads against their
schemas; ``expressions`` the safe JMESPath templates; ``diagram`` the Mermaid drawing of a
graph and ``svg`` the SVG one (a task's path coloured), both walking it through ``walk``;
``paths`` the JSON paths faults are printed with. ``cadence`` is when a recurring schedule
ticks (cron or interval), pure arithmetic.
"""

from toolkit.definition.load import (
    definition_from_body,
    load_definition,
    load_definitions,
    parse_definition,
    schema_path,
)
from toolkit.definition.model import (
    DEFAULT_MAX_STEPS,
    TIMEOUT_ERROR,
    Branch,
    BranchStep,
    Callback,
    ChoiceRule,
    ChoiceStep,
    Compensation,
    DistributedMapStep,
    EffectStep,
    FailStep,
    ItemSource,
    MapStep,
    ParallelStep,
    Reservation,
    SetStep,
    Step,
    Subscription,
    SucceedStep,
    Trigger,
    WaitEvent,
    WaitStep,
    WorkflowDefinition,
    WorkflowStep,
    event_signal,
)
from toolkit.definition.payloads import validate_payload
from toolkit.definition.policies import CatchRule, RetryPolicy, catch_target, error_name_problem

__all__ = [
    "DEFAULT_MAX_STEPS", "TIMEOUT_ERROR", "Branch", "BranchStep", "Callback", "CatchRule",
    "ChoiceRule", "ChoiceStep", "Compensation", "DistributedMapStep", "EffectStep", "FailStep",
    "ItemSource", "MapStep",
    "ParallelStep", "Reservation", "RetryPolicy", "SetStep", "Step", "Subscription",
    "SucceedStep", "Trigger", "WaitEvent", "WaitStep", "WorkflowDefinition", "WorkflowStep",
    "catch_target", "definition_from_body", "error_name_problem", "event_signal",
    "load_definition", "load_definitions",
    "parse_definition", "schema_path", "validate_payload",
]  # fmt: skip
