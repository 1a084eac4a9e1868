"""``choice``: go to the first rule whose condition holds, else the default."""

from __future__ import annotations

from toolkit.definition import ChoiceStep
from toolkit.definition.expressions import is_truthy
from toolkit.engine.protocol import Failed, Goto, StepContext, StepKind, Transition


async def run(ctx: StepContext, step: ChoiceStep) -> Transition:
    """The first rule whose ``when`` is truthy, else ``default``; none: ``NoChoiceMatched``."""
    target = next(
        (rule.next for rule in step.choices if is_truthy(rule.when.render(ctx.scope))),
        step.default,
    )
    if target is None:
        message = f"no choice of step {step.id!r} matched"
        return Failed({"name": "NoChoiceMatched", "message": message})
    return Goto(target)


KIND = StepKind(run, pure=True)
