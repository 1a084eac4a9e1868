"""Wait steps in-process against PostgreSQL: timers, timestamps, signals (kept, consumed once,
in order), the first of several events, and signal payload schemas."""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import deploy_submit, drain, due_in, make_due, sql
from tests.helpers.workflows import TIMER, definition
from toolkit.engine import Interpreter
from toolkit.errors import InputError, TaskTerminal, UnknownSignal, UnknownTask
from toolkit.store import Store

pytestmark = pytest.mark.anyio


# --- timers -----------------------------------------------------------------------------------


async def test_timer_releases_the_lease_and_fires_once_at_its_time(store: Store) -> None:
    (task_id,) = await deploy_submit(store, TIMER, [{}])
    report = await drain(store, TIMER)
    task = await store.tasks.get(task_id)
    assert report.waiting == 1
    assert (task.state, task.wait_reason, task.lease_owner) == ("waiting", "timer", None)
    assert 3500 < await due_in(store, task_id) <= 3600  # an hour from now, in database time
    assert await drain(store, TIMER) and (await store.tasks.get(task_id)).state == "waiting"
    await make_due(store, task_id)
    report = await drain(store, TIMER)
    task = await store.tasks.get(task_id)
    assert report.succeeded == 1 and task.state == "succeeded"
    assert task.result["value"] == "done"
    assert [e["record"] for e in await store.tasks.evidence(task_id)] == ["started", "completed"]


UNTIL = """
name: until
version: 1
input: {type: object}
start: hold
steps:
  hold: {wait: {until: "${ input.at }"}}
"""


async def test_wait_until_uses_the_given_timestamp(store: Store) -> None:
    past, future, bad = await deploy_submit(
        store,
        UNTIL,
        [{"at": "2001-01-01T00:00:00Z"}, {"at": "2999-01-01T00:00:00+02:00"}, {"at": "soon"}],
    )
    await drain(store, UNTIL)
    assert (await store.tasks.get(past)).state == "succeeded"  # already due: fired at once
    waiting = await store.tasks.get(future)
    assert waiting.state == "waiting" and waiting.run_at.year == 2998
    failed = await store.tasks.get(bad)
    assert failed.state == "failed" and "ISO-8601" in failed.error["message"]


# --- signals ----------------------------------------------------------------------------------

SIGNALLED = """
name: signalled
version: 1
input: {type: object}
start: first
steps:
  first:
    wait: {signal: go, timeout: 1h}
    next: second
    catch: [{errors: [Timeout], next: timed_out}]
  second: {wait: {signal: go}, next: done}
  done: {succeed: {output: ["${ steps.first }", "${ steps.second }"]}}
  timed_out: {succeed: {output: "${ steps.first.error.name }"}}
"""


async def test_signals_are_kept_consumed_once_in_order_and_wake_the_task(store: Store) -> None:
    early, late, never = await deploy_submit(store, SIGNALLED, [{}, {}, {}])
    # Sent before the task reaches the wait: kept, consumed then, in order.
    await store.tasks.signal(early, "go", {"n": 1})
    await store.tasks.signal(early, "go", {"n": 2})
    await store.tasks.signal(early, "go", {"n": 3})
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(early)).result == [{"n": 1}, {"n": 2}]
    consumed = [(s["payload"]["n"], s["consumed_by"]) for s in await store.tasks.signals(early)]
    assert consumed == [(1, "first#1"), (2, "second#1"), (3, None)]

    # Sent while the task waits: it becomes due at once.
    late_task = await store.tasks.get(late)
    assert late_task.state == "waiting" and late_task.wait_reason == "signal"
    await store.tasks.signal(late, "go", "a")
    await store.tasks.signal(late, "other", "ignored", force=True)
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(late)).state == "waiting"  # now on the second wait
    await store.tasks.signal(late, "go", "b")
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(late)).result == ["a", "b"]

    # The timeout routes to catch, with the error as data.
    await make_due(store, never)
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(never)).result == "Timeout"

    with pytest.raises(TaskTerminal):
        await store.tasks.signal(early, "go")
    with pytest.raises(UnknownTask):
        await store.tasks.signal(10**9, "go")


async def test_a_wait_without_a_timeout_woken_with_no_signal_waits_again(store: Store) -> None:
    """Regression: a signal wait without a timeout, resumed when no signal was stored (a
    wake-up for nothing, or a stale cycle whose signal a newer lease took), read its
    deadline as passed and failed formatting the timeout it does not have (TypeError: the
    task failed with an internal error; seen in a chaos run on the cluster)."""
    (task_id,) = await deploy_submit(store, SIGNALLED, [{}])
    await store.tasks.signal(task_id, "go", "first")
    await drain(store, SIGNALLED)
    task = await store.tasks.get(task_id)
    assert task.state == "waiting" and task.checkpoint["cursor"] == "second", task
    await make_due(store, task_id)  # woken, and no signal stored
    await drain(store, SIGNALLED)
    task = await store.tasks.get(task_id)
    assert task.state == "waiting" and task.wait_reason == "signal", (task, task.error)
    await store.tasks.signal(task_id, "go", "second")
    await drain(store, SIGNALLED)
    assert (await store.tasks.get(task_id)).result == ["first", "second"]


async def test_a_signal_no_step_waits_for_is_refused_unless_forced(store: Store) -> None:
    """Issue 24, item 11: a misspelt signal name was stored forever without a word."""
    (task_id,) = await deploy_submit(store, SIGNALLED, [{}])
    with pytest.raises(UnknownSignal) as refused:
        await store.tasks.signal(task_id, "og", {"n": 1})
    message = str(refused.value)
    assert "no step of its definition waits for signal 'og'" in message, message
    assert "it waits for 'go'" in message and "(force=True stores it anyway)" in message, message
    assert await store.tasks.signals(task_id) == [], "a refused signal must not be stored"
    forced = await store.tasks.signal(task_id, "og", {"n": 2}, force=True)
    assert [s["id"] for s in await store.tasks.signals(task_id)] == [forced]


async def test_a_signal_racing_the_wait_commit_is_not_lost(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal stored while the task still holds its lease wakes it right after it waits."""
    (task_id,) = await deploy_submit(store, SIGNALLED, [{}])
    d = definition(SIGNALLED)
    (task,) = await store.leases.claim("w", [d.digest], 1, 30.0)

    class Racing(type(store.leases)):  # type: ignore[misc]
        async def next_signal(
            self,
            task_id: int,
            names: Any,
            taken: Any = (),
            address: Any = None,
            *,
            tenant: str,
        ) -> Any:
            found = await super().next_signal(task_id, names, taken, address, tenant=tenant)
            await store.tasks.signal(task_id, names[0], "raced")  # arrives after the look
            return found

    monkeypatch.setattr(store, "leases", Racing(store.db))
    await Interpreter(store, app, "w").execute(task, d)
    record = await store.tasks.get(task_id)
    assert record.state == "waiting"
    due = await sql(
        store, "SELECT run_at <= clock_timestamp() FROM toolkit_tasks WHERE id = %s", task_id
    )
    assert due[0][0]  # woken at once, not at the timeout an hour away


# --- the first of several events --------------------------------------------------------------

ANY = """
name: first-event
version: 1
start: wait
steps:
  wait:
    wait:
      any:
        - {signal: approve, next: approved}
        - {signal: reject, next: rejected}
        - {duration: 1d, next: expired}
  approved: {succeed: {output: "${ steps.wait }"}}
  rejected: {succeed: {output: rejected}}
  expired: {succeed: {output: expired}}
"""


async def test_the_first_signal_wins_and_only_it_is_consumed(store: Store) -> None:
    (task_id,) = await deploy_submit(store, ANY, [{}])
    await drain(store, ANY)
    assert (await store.tasks.get(task_id)).wait_reason == "signal"
    await store.tasks.signal(task_id, "approve", {"by": "ann"})
    await store.tasks.signal(task_id, "reject", None)
    await drain(store, ANY)
    task = await store.tasks.get(task_id)
    assert task.result == {"event": "approve", "payload": {"by": "ann"}}
    signals = {s["name"]: s["consumed_at"] is not None for s in await store.tasks.signals(task_id)}
    assert signals == {"approve": True, "reject": False}


async def test_the_timer_of_a_wait_for_any_fires_when_no_signal_came(store: Store) -> None:
    (task_id,) = await deploy_submit(store, ANY, [{}])
    await drain(store, ANY)
    assert 86000 < await due_in(store, task_id) <= 86400
    await make_due(store, task_id)
    await drain(store, ANY)
    assert (await store.tasks.get(task_id)).result == "expired"


# --- signal payload schema --------------------------------------------------------------------

SCHEMA = """
name: signal-schema
version: 1
start: wait
steps:
  wait:
    wait:
      signal: approved
      schema:
        type: object
        required: [by]
        properties: {by: {type: string}, level: {type: integer, default: 1}}
"""


async def test_a_signal_failing_its_schema_is_refused_and_defaults_are_applied(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, SCHEMA, [{}])
    with pytest.raises(InputError, match=r"\$\.by") as refused:
        await store.tasks.signal(task_id, "approved", {"by": 7})
    assert refused.value.path == "$.by"
    assert await store.tasks.signals(task_id) == []  # not stored
    await store.tasks.signal(task_id, "approved", {"by": "ann"})
    await drain(store, SCHEMA)
    assert (await store.tasks.get(task_id)).result == {"by": "ann", "level": 1}


TWO_WAITS = """
name: two-waits
version: 1
start: w1
steps:
  w1: {wait: {signal: a}, next: w2}
  w2: {wait: {signal: a, schema: {type: object}}}
"""


async def test_the_wait_a_task_is_at_decides_its_signals_schema(store: Store) -> None:
    (task_id,) = await deploy_submit(store, TWO_WAITS, [{}])
    await drain(store, TWO_WAITS)  # waiting at w1, which takes any payload
    await store.tasks.signal(task_id, "a", "anything")
    await drain(store, TWO_WAITS)  # now at w2: an object
    with pytest.raises(InputError, match='expected object, got string "anything"'):
        await store.tasks.signal(task_id, "a", "anything")
    await store.tasks.cancel(task_id)
    with pytest.raises(TaskTerminal):  # not a schema error: the task has ended
        await store.tasks.signal(task_id, "a", "anything")
