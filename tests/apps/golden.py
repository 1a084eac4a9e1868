"""Handlers of the golden-history scenarios: deterministic and free of I/O.

A handler that awaits nothing runs to its end without letting another branch of the same
cycle in, so the order of a parallel or map step's commits is the same on every run.
``golden.hang_once`` stands in for a process that dies in the middle of a call: its first
call of each idempotency key never returns (the scenario takes the lease over meanwhile).
"""

from __future__ import annotations

from typing import Any

import anyio

from tests.apps.work import slow_call
from toolkit import App, EffectContext

app = App("golden")

#: Callback tokens handed out, oldest first (the scenario completes them).
CALLBACKS: list[str] = []
#: Idempotency keys whose first call hung, and the event set once one hangs.
HUNG: dict[str, anyio.Event] = {}


class Declined(Exception):
    """A business error of the golden handlers (never worth retrying)."""

    error_name = "Declined"


@app.effect("golden.echo")
async def echo(ctx: EffectContext, **args: Any) -> dict[str, Any]:
    """Return the arguments and where the call came from."""
    return {"step": ctx.step, "attempt": ctx.attempt, **args}


@app.effect("golden.flaky")
async def flaky(ctx: EffectContext, fail_times: int = 1, error: str = "Transient") -> Any:
    """Fail the first ``fail_times`` attempts with an error named ``error``."""
    if ctx.attempt <= fail_times:
        exc = Declined if error == "Declined" else type(error, (Exception,), {})
        raise exc(f"attempt {ctx.attempt} of {ctx.step} failed on purpose")
    return {"step": ctx.step, "attempt": ctx.attempt}


@app.effect("golden.spend")
async def spend(ctx: EffectContext, tokens: float = 0) -> dict[str, Any]:
    """Report ``tokens`` spent."""
    ctx.spend(tokens=tokens)
    return {"step": ctx.step, "tokens": tokens}


@app.effect("golden.callback")
async def callback(ctx: EffectContext, **args: Any) -> dict[str, Any]:
    """Hand out the callback token (kept in :data:`CALLBACKS`)."""
    assert ctx.callback_token is not None
    CALLBACKS.append(ctx.callback_token)
    return {"asked": ctx.step, **args}


@app.effect("golden.slow")
async def slow(ctx: EffectContext, seconds: float = 0.0) -> dict[str, Any]:
    """Answer after ``seconds``."""
    await slow_call(seconds)
    return {"step": ctx.step, "slow": seconds}


@app.effect("golden.hang_once")
async def hang_once(ctx: EffectContext, **args: Any) -> dict[str, Any]:
    """Never return from the first call of a key (a crash mid-call); answer the next ones."""
    if ctx.idempotency_key not in HUNG:
        HUNG[ctx.idempotency_key] = anyio.Event()
        HUNG[ctx.idempotency_key].set()
        await anyio.sleep_forever()
    return {"step": ctx.step, "attempt": ctx.attempt, **args}


@app.effect("golden.pages")
async def pages(ctx: EffectContext, cursor: int | None = None) -> dict[str, Any]:
    """A distributed map's page source: ``{"n": 0}``, ``"bad"`` (an input an object schema
    refuses), then ``{"n": 2}`` on a second page."""
    if cursor is None:
        return {"items": [{"n": 0}, "bad"], "cursor": 2}
    return {"items": [{"n": 2}], "cursor": None}
