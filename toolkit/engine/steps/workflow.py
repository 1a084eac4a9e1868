"""``workflow``: start a child task once, then wait for it without a lease."""

from __future__ import annotations

import functools

from toolkit.definition import WorkflowStep
from toolkit.engine.failures import error_data
from toolkit.engine.protocol import Advance, Failed, StepContext, StepKind, Transition, Wait
from toolkit.errors import DefinitionRetired, InputError, PayloadRefused, UnknownDefinition
from toolkit.lifecycle import EventKind, WaitReason
from toolkit.payload import check_payload
from toolkit.store.submission import concurrency_params
from toolkit.store.writes import NEVER, Event
from toolkit.waits import ChildWait


async def run(ctx: StepContext, step: WorkflowStep) -> Transition:
    """Start the step's child (once per occurrence); go on with its result once it ended.

    The child is pinned to the newest active version unless the step names one; a child
    that cannot start (no such definition, all retired, an input its schema refuses) fails
    the step. A child that failed or was cancelled fails the step with its error.
    """
    cycle = ctx.cycle
    store = cycle.services.store
    occurrence = ctx.frame.occurrence(step.id)
    child = await cycle.retrying(
        functools.partial(store.children.get, cycle.task.id, occurrence, tenant=cycle.task.tenant)
    )
    if child is None:
        try:
            definition = await cycle.retrying(
                functools.partial(store.definitions.submittable, step.workflow, step.version)
            )
            child_input = definition.validate_input(step.input.render(ctx.scope))
            check_payload(child_input, store.leases.payload_limits)
            child_tags = definition.task_tags(child_input)
            concurrency = concurrency_params(definition, child_input)
        except (UnknownDefinition, DefinitionRetired, InputError, PayloadRefused) as exc:
            return Failed(error_data(exc))
        if cycle.dirty:
            await cycle.commit()
        child = await cycle.retrying(
            functools.partial(store.children.start, cycle.fence, occurrence, definition,
                              child_input, child_tags, concurrency)
        )  # fmt: skip
        cycle.events.append(
            Event(EventKind.CHILD_STARTED, {"step": step.id, "child_id": child.id,
                                            "workflow": child.name, "version": child.version})
        )  # fmt: skip
    if child.ended:
        ctx.frame.wait = None
        if child.state == "succeeded":
            return Advance(child.result, step.next)
        error = dict(child.error or {})
        if child.state == "cancelled":
            error["name"] = "ChildCancelled"
        error.setdefault("name", "ChildFailed")
        error.setdefault("message", f"child task {child.id} {child.state}")
        return Failed({**error, "child_id": child.id})
    event = Event(EventKind.WAITING, {"step": step.id, "child": child.id})
    return Wait(WaitReason.CHILD, ChildWait(occurrence, child.id), event, run_at=NEVER)


KIND = StepKind(run)
