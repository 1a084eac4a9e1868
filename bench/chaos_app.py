"""The chaos run's workflow and handlers, with the external ledger every effect writes to.

Every call of an effect adds one to ``chaos_ledger.calls`` under its idempotency key, in the
store's database but outside the task rows: the ledger is the ground truth of how many times
an effect really ran, whatever the history says. ``chaos.repeatable`` backs the idempotent
steps, ``chaos.once`` the non-idempotent ones.

A call whose ledger write fails with a connection error has an *uncertain* outcome (the
write may have committed before the connection died). ``chaos.once`` then does what a real
application must do with a non-idempotent call: it asks the external system (the ledger)
whether this very call (by its call id) happened, and only reports a failure, which the
engine retries, when it did not. If the ledger cannot be reached, it keeps asking until the
step's timeout, which sends the effect to reconciliation (fail closed).

Run by the chaos workers as ``toolkit run --app bench.chaos_app``.
"""

from __future__ import annotations

import uuid
from typing import Any, LiteralString

import anyio
import psycopg

import toolkit
from toolkit.errors import ToolkitError

app = toolkit.App("chaos")

#: The definition the chaos run deploys and its workers run.
WORKFLOW = """
name: chaos
version: 1
input:
  type: object
  required: [timer, ms]
  properties:
    timer: {enum: [1, 2, 3]}
    ms: {type: integer, minimum: 0, maximum: 1000}
defaults:
  retry: {max_attempts: 40, initial: 0.2s, factor: 2, max: 2s}
  timeout: 20s
start: reserve
steps:
  reserve:
    effect: chaos.repeatable
    idempotent: true
    args: {ms: "${ input.ms }"}
    next: charge
  charge:
    effect: chaos.once
    idempotent: false
    args: {ms: "${ input.ms }"}
    next: route
  route:
    choice:
      - when: "${ input.timer == `1` }"
        next: pause_1s
      - when: "${ input.timer == `2` }"
        next: pause_2s
    default: pause_3s
  pause_1s: {wait: {duration: 1s}, next: approve}
  pause_2s: {wait: {duration: 2s}, next: approve}
  pause_3s: {wait: {duration: 3s}, next: approve}
  approve:
    wait: {signal: approve}
    next: ship
  ship:
    effect: chaos.once
    idempotent: false
    args: {ms: "${ input.ms }", approval: "${ steps.approve }"}
    next: notify
  notify:
    effect: chaos.repeatable
    idempotent: true
    args: {ms: "${ input.ms }"}
    next: fanout
  fanout:
    parallel:
      branches:
        audit:
          start: record
          steps:
            record: {effect: chaos.once, idempotent: false, args: {ms: "${ input.ms }"}}
        index:
          start: update
          steps:
            update: {effect: chaos.repeatable, idempotent: true, args: {ms: "${ input.ms }"}}
    next: done
  done:
    succeed:
      output: {charge: "${ steps.charge }", ship: "${ steps.ship }", notify: "${ steps.notify }",
               fanout: "${ steps.fanout }"}
"""

#: The signal the harness sends to every task.
SIGNAL = "approve"

CREATE_LEDGER: LiteralString = """
CREATE TABLE IF NOT EXISTS chaos_ledger (
    idempotency_key text PRIMARY KEY,
    step text NOT NULL,
    idempotent boolean NOT NULL,
    calls integer NOT NULL,
    call_ids text[] NOT NULL
)"""
_RECORD_CALL: LiteralString = """
INSERT INTO chaos_ledger (idempotency_key, step, idempotent, calls, call_ids)
VALUES (%s, %s, %s, 1, ARRAY[%s])
ON CONFLICT (idempotency_key) DO UPDATE
SET calls = chaos_ledger.calls + 1, call_ids = chaos_ledger.call_ids || excluded.call_ids
"""
_CALL_RECORDED: LiteralString = (
    "SELECT 1 FROM chaos_ledger WHERE idempotency_key = %s AND %s = ANY(call_ids)"
)
#: Seconds between two looks at the ledger while its answer is unknown.
_VERIFY_PAUSE = 0.2


async def _pause(ms: int) -> None:
    if ms:
        await anyio.sleep(ms / 2000)  # half before the ledger write, half after


async def _record(ctx: toolkit.EffectContext, call_id: str, *, idempotent: bool) -> None:
    async with ctx.connection() as conn:
        await conn.execute(_RECORD_CALL, (ctx.idempotency_key, ctx.step, idempotent, call_id))


async def _call_happened(ctx: toolkit.EffectContext, call_id: str) -> bool:
    """Ask the ledger whether call ``call_id`` was recorded, until it answers."""
    while True:
        try:
            async with ctx.connection() as conn:
                cursor = await conn.execute(_CALL_RECORDED, (ctx.idempotency_key, call_id))
                return await cursor.fetchone() is not None
        except (ToolkitError, psycopg.Error):
            await anyio.sleep(_VERIFY_PAUSE)


def _result(ctx: toolkit.EffectContext, call_id: str) -> dict[str, Any]:
    return {"step": ctx.step, "attempt": ctx.attempt, "token": ctx.fencing_token, "call": call_id}


@app.effect("chaos.repeatable")
async def repeatable(ctx: toolkit.EffectContext, ms: int = 0) -> dict[str, Any]:
    """An idempotent effect: a failed ledger write is simply an error (a retry is safe)."""
    call_id = uuid.uuid4().hex
    await _pause(ms)
    await _record(ctx, call_id, idempotent=True)
    await _pause(ms)
    return _result(ctx, call_id)


@app.effect("chaos.once")
async def once(ctx: toolkit.EffectContext, ms: int = 0, approval: Any = None) -> dict[str, Any]:
    """A non-idempotent effect: an uncertain ledger write is resolved before answering."""
    call_id = uuid.uuid4().hex
    await _pause(ms)
    try:
        await _record(ctx, call_id, idempotent=False)
    except (ToolkitError, psycopg.Error):
        if not await _call_happened(ctx, call_id):
            raise  # it did not happen: a failure the engine may retry
    await _pause(ms)
    return {**_result(ctx, call_id), "approval": approval}
