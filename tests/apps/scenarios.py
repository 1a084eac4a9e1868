"""Handlers of the crash-matrix and acceptance tests (their own :class:`~toolkit.App`).

Every handler counts its calls in ``test_calls`` (created in the tests' template database),
keyed by idempotency key, outside the task rows: the count is the ground truth of how many
times an effect really ran, whatever the store says about it.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

from tests.apps.counting import RECORD_CALL
from tests.apps.work import blocking_work, slow_call
from toolkit import App, EffectContext, faults

app = App("scenarios")

RECORD_CALL_RETURNING = RECORD_CALL + " RETURNING calls"

#: Exit status of a worker killed by the poison-input handler.
POISON_EXIT_CODE = 13


async def record_call(ctx: EffectContext, key: str | None = None) -> int:
    """Count one call under ``key`` (default: the idempotency key); return the count so far."""
    async with ctx.connection() as conn:
        cursor = await conn.execute(
            RECORD_CALL_RETURNING, (key or ctx.idempotency_key, ctx.step, ctx.fencing_token)
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


def record_call_sync(ctx: EffectContext, key: str) -> int:
    """The same from a sync handler (a worker thread): its own connection to TOOLKIT_DSN."""
    with psycopg.connect(os.environ["TOOLKIT_DSN"], autocommit=True) as conn:
        row = conn.execute(RECORD_CALL_RETURNING, (key, ctx.step, ctx.fencing_token)).fetchone()
    assert row is not None
    return int(row[0])


@app.effect("scn.work")
async def work(ctx: EffectContext, value: Any = None) -> dict[str, Any]:
    """Count the call, then fire the ``during_call`` fault point if one is armed here."""
    await record_call(ctx)
    faults.fault_point("during_call", ctx.step)
    return {"step": ctx.step, "value": value, "key": ctx.idempotency_key}


@app.effect("scn.slow_first_call")
async def slow_first_call(ctx: EffectContext, seconds: float = 0.0) -> dict[str, Any]:
    """Sleep ``seconds`` (without blocking the loop) on the first call of a key only."""
    calls = await record_call(ctx)
    if calls == 1 and seconds:
        await slow_call(seconds)
    return {"step": ctx.step, "calls": calls}


@app.effect("scn.pages")
async def pages(
    ctx: EffectContext, total: int, size: int = 10, cursor: int | None = None,
    hang_at: int | None = None,
) -> dict[str, Any]:
    """A distributed map's page source: items ``{"n": i}``, ``size`` a page; the first call
    for the page at cursor ``hang_at`` hangs (a worker to kill mid-listing)."""
    calls = await record_call(ctx)
    start = cursor or 0
    if start == hang_at and calls == 1:
        await slow_call(600)
    end = min(start + size, total)
    return {"items": [{"n": n} for n in range(start, end)], "cursor": end if end < total else None}


@app.effect("scn.block_loop_first_call")
async def block_loop_first_call(ctx: EffectContext, seconds: float = 0.0) -> dict[str, Any]:
    """Block the event loop (``time.sleep`` inside ``async def``) on the first call only."""
    calls = await record_call(ctx)
    if calls == 1 and seconds:
        blocking_work(seconds)  # deliberately blocks the worker's event loop: heartbeats stall
    return {"step": ctx.step, "calls": calls}


@app.effect("scn.poison")
async def poison(ctx: EffectContext, poison: bool = False, delay: float = 0.5) -> dict[str, Any]:
    """Crash the whole worker process on a poison input (after ``delay`` s), else return."""
    await record_call(ctx)
    if poison:
        await slow_call(delay)  # let the healthy tasks of the same batch commit first
        os._exit(POISON_EXIT_CODE)
    return {"ok": True}


@app.effect("scn.units")
def units(ctx: EffectContext, units: int = 10, seconds: float = 1.0) -> dict[str, Any]:
    """A sync step: ``units`` units of work of ``seconds`` each, checking for cancel between.

    Each unit started is counted under ``<idempotency key>/units``.
    """
    done = 0
    for _ in range(units):
        ctx.check_cancelled()
        record_call_sync(ctx, f"{ctx.idempotency_key}/units")
        blocking_work(seconds)
        done += 1
    return {"units": done}


@app.effect("scn.never_returns")
def never_returns(ctx: EffectContext) -> dict[str, Any]:
    """A sync handler that never returns and never checks ``ctx.cancelled``."""
    record_call_sync(ctx, ctx.idempotency_key)
    while True:
        blocking_work(0.5)


@app.effect("scn.ignores_cancellation")
async def ignores_cancellation(ctx: EffectContext) -> dict[str, Any]:
    """An async handler that swallows every cancellation (an application bug)."""
    await record_call(ctx)
    while True:
        try:
            await slow_call(0.2)
        except BaseException:
            continue
