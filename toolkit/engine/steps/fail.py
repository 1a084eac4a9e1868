"""``fail``: the graph fails with the step's error (no ``catch`` applies)."""

from __future__ import annotations

import json

from toolkit.definition import FailStep
from toolkit.engine.protocol import Failed, StepContext, StepKind, Transition


async def run(ctx: StepContext, step: FailStep) -> Transition:
    """The step's error, its message rendered (as JSON text unless a string).

    The task's completed effects are compensated only with ``compensate: true``.
    """
    message = step.message.render(ctx.scope)
    text = message if isinstance(message, str) else json.dumps(message)
    return Failed({"name": step.error, "message": text}, compensate=step.compensate)


KIND = StepKind(run, pure=True)
