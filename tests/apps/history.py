"""Handlers of the history tests (``tests/history/``): a step that spends, one that fails
its first attempt, and one that always fails."""

from __future__ import annotations

from typing import Any

from toolkit import App, EffectContext

app = App("history-tests")


@app.effect("hist.work")
async def work(ctx: EffectContext, n: int = 0) -> dict[str, Any]:
    ctx.spend(tokens=10)
    return {"n": n}


@app.effect("hist.flaky")
async def flaky(ctx: EffectContext) -> dict[str, Any]:
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {"attempt": ctx.attempt}


@app.effect("hist.broken")
async def broken(ctx: EffectContext) -> None:
    raise ValueError("always broken")
