"""Workflow definitions: the YAML format, its checks and expressions (DESIGN §3).

``model`` holds the validated definition and its steps; ``checks`` the faults found beyond
the JSON Schema (graph, steps, expressions, input schemas); ``yaml_source`` the safe loader
that knows each value's line; ``expressions`` the safe JMESPath templates; ``diagram`` the
Mermaid drawing of a graph; ``paths`` the JSON paths faults are printed with.
"""

from toolkit.definition.model import (
    DEFAULT_MAX_STEPS,
    TIMEOUT_ERROR,
    Branch,
    BranchStep,
    Callback,
    CatchRule,
    ChoiceRule,
    ChoiceStep,
    Compensation,
    EffectStep,
    FailStep,
    MapStep,
    ParallelStep,
    Reservation,
    RetryPolicy,
    SetStep,
    Step,
    SucceedStep,
    WaitEvent,
    WaitStep,
    WorkflowDefinition,
    WorkflowStep,
    catch_target,
    definition_from_body,
    load_definition,
    load_definitions,
    parse_definition,
    schema_path,
    validate_payload,
)

__all__ = [
    "DEFAULT_MAX_STEPS", "TIMEOUT_ERROR", "Branch", "BranchStep", "Callback", "CatchRule",
    "ChoiceRule", "ChoiceStep", "Compensation", "EffectStep", "FailStep", "MapStep",
    "ParallelStep", "Reservation", "RetryPolicy", "SetStep", "Step", "SucceedStep",
    "WaitEvent", "WaitStep", "WorkflowDefinition", "WorkflowStep", "catch_target",
    "definition_from_body", "load_definition", "load_definitions", "parse_definition",
    "schema_path", "validate_payload",
]  # fmt: skip
