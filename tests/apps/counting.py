"""Handlers that count their calls in a table outside the task rows (``test_calls``, created
in the tests' template database).

Used by in-process and process-level tests: the count of calls per idempotency key is the
ground truth for "no completed effect ran twice".
"""

from __future__ import annotations

import os
import threading
from typing import Any

from tests.apps.work import slow_call
from toolkit import App, EffectContext

app = App("counting")

CREATE_CALLS = """
CREATE TABLE IF NOT EXISTS test_calls (
    idempotency_key text PRIMARY KEY,
    step text NOT NULL,
    calls integer NOT NULL,
    last_token bigint NOT NULL
)"""
RECORD_CALL = """
INSERT INTO test_calls (idempotency_key, step, calls, last_token) VALUES (%s, %s, 1, %s)
ON CONFLICT (idempotency_key) DO UPDATE
SET calls = test_calls.calls + 1, last_token = excluded.last_token
"""


async def record_call(ctx: EffectContext) -> None:
    async with ctx.connection() as conn:
        await conn.execute(RECORD_CALL, (ctx.idempotency_key, ctx.step, ctx.fencing_token))


@app.effect("count.work")
async def work(ctx: EffectContext, seconds: float = 0.0, value: Any = None) -> dict[str, Any]:
    await record_call(ctx)
    if seconds:
        await slow_call(seconds)
    return {"step": ctx.step, "value": value, "attempt": ctx.attempt}


@app.effect("count.flaky")
async def flaky(
    ctx: EffectContext, fail_times: int = 1, error: str = "Transient"
) -> dict[str, Any]:
    await record_call(ctx)
    if ctx.attempt <= fail_times:
        raise _named(error)(f"attempt {ctx.attempt} failed on purpose")
    return {"attempt": ctx.attempt}


@app.effect("count.tag")
async def tag(ctx: EffectContext, tags: dict[str, str], fail: bool = False) -> dict[str, Any]:
    """Tag the task (``ctx.tag``); fail afterwards when asked (the tags are kept then too)."""
    for key, value in tags.items():
        ctx.tag(key, value)
    if fail:
        raise _named("Tagged")("failed after tagging")
    return {"tags": ctx.tags}


#: The meetings of ``count.sync_meet``, by number of parties (a barrier is used again once
#: all its parties passed).
_MEETINGS: dict[int, threading.Barrier] = {}


@app.effect("count.sync_meet")
def sync_meet(ctx: EffectContext, parties: int = 2) -> dict[str, Any]:
    """Wait in its thread until ``parties`` calls meet (10 s at most, else the effect fails):
    only calls that run in threads at the same time can."""
    _MEETINGS.setdefault(parties, threading.Barrier(parties, timeout=10)).wait()
    return {"step": ctx.step, "thread": threading.current_thread() is not threading.main_thread()}


@app.effect("count.not_json")
async def not_json(ctx: EffectContext) -> Any:
    return {"when": object()}


@app.effect("count.spend")
async def spend(ctx: EffectContext, tokens: float = 0, value: Any = None) -> dict[str, Any]:
    await record_call(ctx)
    ctx.spend(tokens=tokens)
    return {"value": value, "tokens": tokens}


#: Calls of ``count.concurrent`` in progress now, and the most seen at once (in-process).
CONCURRENCY = {"now": 0, "most": 0}


@app.effect("count.concurrent")
async def concurrent(ctx: EffectContext, seconds: float = 0.05, value: Any = None) -> Any:
    await record_call(ctx)
    CONCURRENCY["now"] += 1
    CONCURRENCY["most"] = max(CONCURRENCY["most"], CONCURRENCY["now"])
    try:
        await slow_call(seconds)
    finally:
        CONCURRENCY["now"] -= 1
    return value


@app.effect("count.fail")
async def fail(ctx: EffectContext, error: str = "Broken") -> None:
    await record_call(ctx)
    raise _named(error)(f"{ctx.step} fails on purpose")


#: Callback tokens handed out by ``count.callback``, in order.
TOKENS: list[str] = []


@app.effect("count.callback")
async def hand_out(ctx: EffectContext, complete_early: bool = False) -> str:
    assert ctx.callback_token is not None
    TOKENS.append(ctx.callback_token)
    if complete_early:  # the external system answers before the handler returns
        async with ctx.connection() as conn:
            await conn.execute(
                "UPDATE toolkit_callbacks SET state = 'completed', result = '\"early\"',"
                " completed_at = statement_timestamp() WHERE token = %s",
                (ctx.callback_token,),
            )
    return "handed out"


@app.effect("count.poll")
async def poll(ctx: EffectContext, ready_after: int = 1_000_000) -> dict[str, Any]:
    """A status check: ready once this step of this task has been called ``ready_after``
    times (each loop of a polling loop is a new occurrence, with its own key)."""
    await record_call(ctx)
    async with ctx.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM test_calls WHERE step = %s AND idempotency_key LIKE %s",
            (ctx.step, f"{ctx.task_id}:%"),
        )
        row = await cursor.fetchone()
    polls = int(row[0]) if row else 0
    return {"ready": polls >= ready_after, "polls": polls}


@app.effect("count.crash")
async def crash(ctx: EffectContext) -> None:
    await record_call(ctx)
    os._exit(17)


def _named(name: str) -> type[Exception]:
    return type(name, (Exception,), {})


@app.effect("count.stream")
async def stream(ctx: EffectContext, count: int = 5, seconds: float = 0.05) -> dict[str, Any]:
    """Publish ``count`` values (each after its progress), ``seconds`` apart, then return."""
    for n in range(count):
        await ctx.progress({"at": n})
        await ctx.publish({"token": n})
        await slow_call(seconds)
    return {"tokens": count}


@app.effect("count.stream_sync")
def stream_sync(ctx: EffectContext, count: int = 3) -> dict[str, Any]:
    """A sync handler (run in a thread): publish ``count`` values and progress through the
    event loop's token (``ctx.publish_sync``, ``ctx.progress_sync``)."""
    for n in range(count):
        ctx.progress_sync({"at": n})
        ctx.publish_sync({"token": n})
    return {"tokens": count}


@app.effect("count.pages")
async def pages(
    ctx: EffectContext,
    total: int,
    size: int = 10,
    cursor: int | None = None,
    fail_every: int = 0,
    flaky: bool = False,
    seconds: float = 0.0,
) -> dict[str, Any]:
    """A page source of a distributed map: items ``{"n": i}`` from ``cursor`` (0 first),
    ``size`` a page, ``total`` in all; every ``fail_every``-th item says ``fail``; ``flaky``:
    each page's first attempt fails; ``seconds``: each page after the first takes that long."""
    await record_call(ctx)
    if flaky and ctx.attempt == 1:
        raise _named("Transient")(f"page at {cursor} failed on purpose")
    if seconds and cursor:
        await slow_call(seconds)
    start = cursor or 0
    end = min(start + size, total)
    items = [
        {"n": i, **({"fail": True} if fail_every and i % fail_every == 0 else {})}
        for i in range(start, end)
    ]
    return {"items": items, "cursor": end if end < total else None}


@app.effect("count.first_call_fails")
async def first_call_fails(ctx: EffectContext, fail: bool = True) -> dict[str, Any]:
    """Fail (``Broken``) on the first call of this idempotency key when ``fail``; succeed
    after (a redriven task's call is its second)."""
    await record_call(ctx)
    async with ctx.connection() as conn:
        cursor = await conn.execute(
            "SELECT calls FROM test_calls WHERE idempotency_key = %s", (ctx.idempotency_key,)
        )
        row = await cursor.fetchone()
    if fail and row is not None and row[0] == 1:
        raise _named("Broken")("the first call fails on purpose")
    return {"calls": row[0] if row else 0}
