"""``succeed``: the graph ends with the step's output."""

from __future__ import annotations

from toolkit.definition import SucceedStep
from toolkit.engine.protocol import Finish, StepContext, StepKind, Transition


async def run(ctx: StepContext, step: SucceedStep) -> Transition:
    """The rendered output ends the graph.

    Raises:
        ResultTooLarge, ResultNotJson: the output cannot be stored.
    """
    output = step.output.render(ctx.scope)
    ctx.cycle.check_result(output, step.id, "the output")
    return Finish(output)


KIND = StepKind(run, pure=True)
