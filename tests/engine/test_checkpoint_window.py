"""The checkpoint window (``--checkpoint-window``): idempotent outcomes that share a write.

With a window, the outcome of an idempotent call that ends soon after the cycle's last write
waits for a later write of the cycle; anything else (a non-idempotent intent, spend, limit
slots, a call that ran past the window) is written before the next call, as without one.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.helpers.inprocess import calls, deploy_submit, drain, sql
from tests.helpers.workflows import definition
from toolkit.application import App
from toolkit.engine import Interpreter
from toolkit.engine.cycle import CycleControl
from toolkit.store import Store

pytestmark = pytest.mark.anyio

FOUR_IDEMPOTENT = """
name: four
version: 1
input: {type: object}
start: a
steps:
  a: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: b}
  b: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: c}
  c: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}, next: d}
  d: {effect: count.work, idempotent: true, args: {seconds: "${ input.seconds }"}}
"""


async def _writes(store: Store, task_id: int) -> int:
    """How many writes the task's last cycle made (its write id is ``TOKEN:N``)."""
    ((write,),) = await sql(
        store, "SELECT checkpoint ->> 'write' FROM toolkit_tasks WHERE id = %s", task_id
    )
    return int(write.split(":")[1])


async def _records(store: Store, task_id: int) -> list[tuple[str, str]]:
    return [(e["step"], e["record"]) for e in await store.tasks.evidence(task_id)]


async def test_quick_idempotent_outcomes_share_the_terminal_write(store: Store) -> None:
    (shared,) = await deploy_submit(store, FOUR_IDEMPOTENT, [{"seconds": 0}])
    await drain(store, FOUR_IDEMPOTENT, checkpoint_window=60.0)
    (one_each,) = await deploy_submit(store, FOUR_IDEMPOTENT, [{"seconds": 0}])
    await drain(store, FOUR_IDEMPOTENT)
    for task_id in (shared, one_each):
        record = await store.tasks.get(task_id)
        assert record.state == "succeeded", record
        assert await _records(store, task_id) == [
            (step, "completed") for step in "abcd"
        ], "the same evidence either way"
    assert await _writes(store, shared) == 1, "four outcomes, one write"
    assert await _writes(store, one_each) == 4, "without a window: one write per effect"


async def test_a_call_past_the_window_is_written_before_the_next(store: Store) -> None:
    (task_id,) = await deploy_submit(store, FOUR_IDEMPOTENT, [{"seconds": 0.15}])
    await drain(store, FOUR_IDEMPOTENT, checkpoint_window=0.1)
    assert (await store.tasks.get(task_id)).state == "succeeded"
    assert await _writes(store, task_id) == 4


MIXED = """
name: mixed
version: 1
input: {type: object}
start: a
steps:
  a: {effect: count.work, idempotent: true, next: charge}
  charge: {effect: count.work, idempotent: false, next: meter}
  meter: {effect: count.spend, idempotent: true, args: {tokens: 5}, next: e}
  e: {effect: count.work, idempotent: true, next: f}
  f: {effect: count.work, idempotent: true}
"""


async def test_an_intent_or_a_spend_is_written_before_the_next_call(store: Store) -> None:
    (task_id,) = await deploy_submit(store, MIXED, [{}])
    await drain(store, MIXED, checkpoint_window=60.0)
    record = await store.tasks.get(task_id)
    assert record.state == "succeeded", record
    # a's outcome rides with charge's intent; charge's outcome is written before meter's
    # call (it is not idempotent); meter's spend before e's; e and f share the last write.
    assert await _writes(store, task_id) == 4
    assert await _records(store, task_id) == [
        ("a", "completed"),
        ("charge", "started"),
        ("charge", "completed"),
        ("meter", "completed"),
        ("e", "completed"),
        ("f", "completed"),
    ]


class Crash(BaseException):
    """The worker process dies (not an error a handler returns)."""


async def crash_inside_the_window(store: Store, text: str, at: str) -> list[str]:
    """Run one cycle of the task of ``text`` under a window of 60 s, claimed by a worker with
    a window, dying when step ``at`` is called; then let its lease lapse.

    Returns:
        The idempotency keys of the calls made before the crash, the crashing one included.
    """
    d = definition(text)
    crashing = App("crashing")
    keys: list[str] = []

    @crashing.effect("count.work")
    async def work(ctx: Any, seconds: float = 0.0) -> dict[str, Any]:
        keys.append(ctx.idempotency_key)
        if ctx.step == at:
            raise Crash
        return {}

    (task,) = await store.leases.claim("dead", [d.digest], 1, 30.0, deferring=True)
    control = CycleControl(checkpoint_window=60.0, lease_deadline=anyio.current_time() + 25)
    with pytest.raises(Crash):
        await Interpreter(store, crashing, "dead").execute(task, d, control)
    await sql(
        store, "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() - interval '1s'"
    )
    return keys


async def test_a_crash_inside_the_window_calls_the_unwritten_steps_again_with_their_keys(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, FOUR_IDEMPOTENT, [{"seconds": 0}])
    keys = await crash_inside_the_window(store, FOUR_IDEMPOTENT, "c")
    assert await _records(store, task_id) == [], "a and b were never written"
    await drain(store, FOUR_IDEMPOTENT, checkpoint_window=60.0)
    record = await store.tasks.get(task_id)
    assert record.state == "succeeded", record
    assert await _records(store, task_id) == [(step, "completed") for step in "abcd"]
    again = await calls(store)
    # a, b and c were called again, each with the key of its first call; d once.
    assert again == {**dict.fromkeys(keys, 1), f"{task_id}:d#1": 1}, (keys, again)


STRICT_FIRST = """
name: strict-first
version: 1
input: {type: object}
start: a
steps:
  a: {effect: count.work, idempotent: true, retry: {max_attempts: 1}, next: b}
  b: {effect: count.work, idempotent: true, next: c}
  c: {effect: count.work, idempotent: true}
"""


async def test_a_crash_inside_the_window_is_not_blamed_on_the_step_under_the_cursor(
    store: Store,
) -> None:
    """Regression (a helper's report): the cursor stays on a, which completed; b crashed.
    Blamed on a (max_attempts 1), the healthy task failed AttemptsExhausted."""
    (task_id,) = await deploy_submit(store, STRICT_FIRST, [{}])
    await crash_inside_the_window(store, STRICT_FIRST, "b")
    await drain(store, STRICT_FIRST, checkpoint_window=60.0)
    record = await store.tasks.get(task_id)
    assert record.state == "succeeded", (record.error, await store.tasks.events(task_id))
    kinds = [e["kind"] for e in await store.tasks.events(task_id)]
    assert "attempt_lost" not in kinds, kinds  # the lapse is the task's, not a step's
    assert (await sql(store, "SELECT checkpoint -> 'lapses' FROM toolkit_tasks"))[0][0] is None
