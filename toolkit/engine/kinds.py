"""Every step kind, by the class of the step it runs."""

from __future__ import annotations

from types import MappingProxyType

from toolkit.definition import (
    ChoiceStep,
    DistributedMapStep,
    EffectStep,
    FailStep,
    MapStep,
    ParallelStep,
    SetStep,
    SucceedStep,
    WaitStep,
    WorkflowStep,
)
from toolkit.engine.protocol import Kinds
from toolkit.engine.steps import (
    choice,
    distributed_map,
    effect,
    fail,
    fanout,
    succeed,
    wait,
    workflow,
)
from toolkit.engine.steps import set as set_values

KINDS: Kinds = MappingProxyType(
    {
        ChoiceStep: choice.KIND,
        SetStep: set_values.KIND,
        SucceedStep: succeed.KIND,
        FailStep: fail.KIND,
        EffectStep: effect.KIND,
        WaitStep: wait.KIND,
        ParallelStep: fanout.KIND,
        MapStep: fanout.KIND,
        WorkflowStep: workflow.KIND,
        DistributedMapStep: distributed_map.KIND,
    }
)
