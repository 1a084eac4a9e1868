"""``set``: record computed values as the step's output.

A set step without ``next`` ends the graph with them.
"""

from __future__ import annotations

from toolkit.definition import SetStep
from toolkit.engine.protocol import Advance, StepContext, StepKind, Transition


async def run(ctx: StepContext, step: SetStep) -> Transition:
    """The rendered values are the step's output.

    Raises:
        ResultTooLarge, ResultNotJson: the values cannot be stored.
    """
    values = step.values.render(ctx.scope)
    ctx.cycle.check_result(values, step.id, "the values")
    return Advance(values, step.next)


KIND = StepKind(run, pure=True)
