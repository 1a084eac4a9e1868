"""Handlers of the tracing tests, in a worker that writes its spans to a file as they end
(``$TEST_SPAN_DIR``, tests/helpers/spans.py): the application configures OpenTelemetry,
as users do."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from tests.apps.counting import record_call
from tests.apps.work import slow_call
from tests.helpers.spans import install_from_environment
from toolkit import App, EffectContext

install_from_environment()

app = App("traced")


@app.effect("traced.step")
async def step(ctx: EffectContext, value: Any = None) -> dict[str, Any]:
    """Record the call, and a span of the application's own under the step's span."""
    await record_call(ctx)
    with trace.get_tracer("tests.apps.traced").start_as_current_span("own work"):
        return {"step": ctx.step, "value": value}


@app.effect("traced.hang_first")
async def hang_first(ctx: EffectContext) -> dict[str, Any]:
    """On its first attempt, hang (a worker to SIGKILL); then return."""
    await record_call(ctx)
    if ctx.attempt == 1:
        await slow_call(600)
    return {"attempt": ctx.attempt}
