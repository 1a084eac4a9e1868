"""Events (issue 21): an emit is recorded once per key, starts the tasks its triggers start
(once per start key), and reaches the correlated waits that match it, whether the task
waits already, has not reached its wait yet, or has not run at all."""

from __future__ import annotations

from typing import Any

import pytest

from tests.apps.counting import app
from tests.helpers.inprocess import deploy_submit, drain, sql
from tests.helpers.workflows import definition
from toolkit.application import EffectContext
from toolkit.errors import InputError
from toolkit.store import Store
from toolkit.store.filters import TaskFilter
from toolkit.store.queries import query

pytestmark = pytest.mark.anyio

ORDER = """
name: order-flow
version: 1
input: {type: object, required: [order_id], properties: {order_id: {type: string}}}
triggers:
  - event: order.placed
    when: "${ event.total > `0` }"
    input: {order_id: "${ event.order_id }"}
    key: "${ event.order_id }"
start: pay
steps:
  pay:
    wait: {event: payment.settled, match: {order_id: "${ input.order_id }"}, timeout: 2d}
    next: done
    catch: [{errors: [Timeout], next: expired}]
  expired: {fail: {error: PaymentTimeout}}
  done: {succeed: {output: "${ steps.pay }"}}
"""


async def states(store: Store) -> dict[int, str]:
    return {task.id: task.state for task in await store.tasks.list(TaskFilter(), limit=1000)}


async def test_emits_de_duplicate_by_key_and_triggers_start_one_task_per_start_key(
    store: Store,
) -> None:
    await store.definitions.deploy(definition(ORDER))
    firsts = []
    for i in range(100):  # 10 of them repeat an earlier event key: 90 events
        n = i if i < 90 else i - 90
        done = await store.events.emit(
            "order.placed", {"order_id": f"o-{n}", "total": 5}, key=f"placed-{n}"
        )
        assert done.duplicate == (i >= 90), (i, done)
        if i < 90:
            assert len(done.started) == 1, done
            firsts.append(done.event_id)
        else:
            assert done.event_id == firsts[n] and done.started == (), done
    found = await states(store)
    assert len(found) == 90 and set(found.values()) == {"queued"}, found
    # An event whose start key names a live task is delivered to it (signal-with-start).
    again = await store.events.emit("order.placed", {"order_id": "o-3", "total": 7})
    assert again.started == () and len(again.delivered) == 1, again
    assert len(await states(store)) == 90
    # `when` false: nothing starts; a refused input: nothing is recorded.
    skipped = await store.events.emit("order.placed", {"order_id": "o-x", "total": 0})
    assert skipped.started == () and skipped.delivered == (), skipped
    with pytest.raises(InputError, match=r"definition order-flow v1, triggers\[0\]"):
        await store.events.emit("order.placed", {"order_id": 42, "total": 1})
    listed = await store.events.list(name="order.placed", limit=1000)
    assert len(listed) == 92 and all(e.payload["order_id"] != 42 for e in listed)


async def test_a_correlated_wait_takes_its_event_and_not_fifty_others(store: Store) -> None:
    d = definition(ORDER)
    await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(d, [{"order_id": "o-1"}])
    await drain(store, ORDER)
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason) == ("waiting", "signal"), task
    for n in range(50):
        done = await store.events.emit("payment.settled", {"order_id": f"other-{n}"})
        assert done.delivered == (), done
    await drain(store, ORDER)
    assert (await store.tasks.get(task_id)).state == "waiting"
    done = await store.events.emit("payment.settled", {"order_id": "o-1", "amount": 12})
    assert done.delivered == (task_id,), done
    await drain(store, ORDER)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task, await store.tasks.events(task_id))
    assert task.result == {"order_id": "o-1", "amount": 12}
    assert [e["how"] for e in await store.events.of_task(task_id)] == ["delivered"]


async def test_an_event_emitted_before_the_task_ran_is_not_lost(store: Store) -> None:
    d = definition(ORDER)
    await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(d, [{"order_id": "o-7"}])
    done = await store.events.emit("payment.settled", {"order_id": "o-7", "paid": True})
    assert done.delivered == (), done  # nobody subscribed yet: the task has not run
    await drain(store, ORDER)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task, await store.tasks.events(task_id))
    assert task.result == {"order_id": "o-7", "paid": True}
    # An event emitted before the task was submitted is not its event.
    (late,) = await store.tasks.submit(d, [{"order_id": "o-7"}])
    await drain(store, ORDER)
    assert (await store.tasks.get(late)).state == "waiting"


EMITTING = """
name: emitting
version: 1
input: {type: object}
start: work
steps:
  work: {effect: count.emit_settled, idempotent: true, args: {order: "${ input.order_id }"},
         next: pay}
  pay:
    wait:
      any:
        - {event: payment.settled, match: {order_id: "${ input.order_id }"}, next: done}
        - {duration: 1d, next: done}
  done: {succeed: {output: "${ steps.pay }"}}
"""


#: The store ``count.emit_settled`` emits into (set by the test).
STORE: dict[str, Store] = {}


@app.effect("count.emit_settled")
async def emit_settled(ctx: EffectContext, order: str) -> dict[str, Any]:
    """Emits the event the task is about to wait for: between its start and its wait."""
    store = STORE["store"]
    await store.events.emit("payment.settled", {"order_id": order, "by": "handler"},
                            key=f"settled-{order}")  # fmt: skip
    return {}


async def test_an_event_emitted_between_the_start_and_the_wait_is_taken_by_the_wait(
    store: Store,
) -> None:
    STORE["store"] = store
    (task_id,) = await deploy_submit(store, EMITTING, [{"order_id": "o-9"}])
    await drain(store, EMITTING)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task, await store.tasks.events(task_id))
    assert task.result == {"event": "payment.settled",
                           "payload": {"order_id": "o-9", "by": "handler"}}  # fmt: skip


async def test_matching_an_event_against_100k_subscriptions_reads_one_index_range(
    store: Store,
) -> None:
    d = definition(ORDER)
    await store.definitions.deploy(d)
    await sql(
        store,
        "INSERT INTO toolkit_tasks (definition_name, definition_version, definition_digest,"
        " input, checkpoint, state, wait_reason, run_at) SELECT 'order-flow', 1, %s,"
        " jsonb_build_object('order_id', 'o-' || i), '{}', 'waiting', 'signal', 'infinity'"
        " FROM generate_series(1, 100000) i",
        d.digest,
    )
    await sql(
        store,
        "INSERT INTO toolkit_event_subscriptions (tenant, event, fields, match, task_id)"
        " SELECT 'default', 'payment.settled', '[\"order_id\"]', '[\"' || (input ->> 'order_id')"
        " || '\"]', id FROM toolkit_tasks",
    )
    shape = "INSERT INTO toolkit_event_shapes VALUES ('payment.settled', '[\"order_id\"]')"
    await sql(store, shape)
    await sql(store, "ANALYZE toolkit_event_subscriptions")
    await sql(store, "ANALYZE toolkit_tasks")
    params = {"tenant": "default", "name": "payment.settled", "fields": '["order_id"]',
              "match": '["o-500"]'}  # fmt: skip
    async with store.db.connection() as conn:
        cursor = await conn.execute(
            "EXPLAIN (FORMAT JSON) " + query("event_subscribers"), params  # type: ignore[arg-type]
        )
        plan = await cursor.fetchone()
    assert plan is not None
    text = str(plan[0])
    assert "Seq Scan" not in text, text
    assert "toolkit_event_subscriptions_pkey" in text, text
    done = await store.events.emit("payment.settled", {"order_id": "o-500"})
    assert len(done.delivered) == 1, done


CANCELLABLE = """
name: cancellable
version: 1
input: {type: object, required: [order_id]}
cancel_on:
  - {event: order.cancelled, match: {order_id: "${ input.order_id }"}}
start: work
steps:
  work: {effect: count.emit_cancelled, idempotent: true,
         args: {order: "${ input.order_id }", emit: "${ input.cancel_while_running }"},
         next: pay}
  pay:
    wait: {event: payment.settled, match: {order_id: "${ input.order_id }"}}
"""


@app.effect("count.emit_cancelled")
async def emit_cancelled(ctx: EffectContext, order: str, emit: Any = None) -> dict[str, Any]:
    """Emits the task's own cancel event while it runs (leased), when asked to."""
    if emit:
        await STORE["store"].events.emit("order.cancelled", {"order_id": order})
    return {}


async def test_cancel_on_cancels_a_waiting_a_running_and_a_not_yet_started_task(
    store: Store,
) -> None:
    STORE["store"] = store
    ids = await deploy_submit(
        store, CANCELLABLE,
        [{"order_id": "waits"}, {"order_id": "other"},
         {"order_id": "runs", "cancel_while_running": True}],
    )  # fmt: skip
    waits, other, runs = ids
    await drain(store, CANCELLABLE)
    found = await states(store)
    assert (found[waits], found[other]) == ("waiting", "waiting"), found
    # The running one emitted its own cancel event while it held its lease: asked to stop,
    # it stopped at its next durable point.
    assert found[runs] == "cancelled", (found, await store.tasks.events(runs))
    done = await store.events.emit("order.cancelled", {"order_id": "waits"})
    assert done.cancelled == (waits,) and done.delivered == (), done
    task = await store.tasks.get(waits)
    assert task.state == "cancelled" and task.error is not None
    assert task.error["message"] == f"event {done.event_id} (order.cancelled)", task.error
    assert (await store.tasks.get(other)).state == "waiting"
    assert [e["how"] for e in await store.events.of_task(waits)] == ["cancelled"]
    # An event emitted before a task ran cancels it as it starts: no step runs.
    (early,) = await store.tasks.submit(definition(CANCELLABLE), [{"order_id": "early"}])
    await store.events.emit("order.cancelled", {"order_id": "early"})
    await drain(store, CANCELLABLE)
    assert (await store.tasks.get(early)).state == "cancelled"
    assert await store.tasks.evidence(early) == []


async def test_a_payload_a_declared_schema_refuses_is_not_emitted(store: Store) -> None:
    declaring = definition(ORDER.replace(
        "triggers:",
        "events:\n  order.placed: {type: object, required: [order_id, total]}\ntriggers:",
    ))  # fmt: skip
    await store.definitions.deploy(declaring)
    with pytest.raises(InputError, match=r"payload of event 'order.placed' \(schema of "
                       r"order-flow v1\).*total"):  # fmt: skip
        await store.events.emit("order.placed", {"order_id": "o-1"})
    assert await store.events.list() == []
    done = await store.events.emit("order.placed", {"order_id": "o-1", "total": 2})
    assert len(done.started) == 1


LOOSE = """
name: loose
version: 1
input: {type: object}
start: wait
steps:
  wait: {wait: {event: thing.done, match: {ref: "${ input.ref }"}, timeout: 1d}}
"""


async def test_a_match_is_the_same_json_value_whenever_the_event_came(store: Store) -> None:
    """Regression (a user's report): an event emitted before the task subscribed matched by
    containment ([1, 2, 3] took a wait for [1]; 7.0 one for 7), one emitted after by
    equality. Both are equality now; and a null correlation matches nothing."""
    d = definition(LOOSE)
    await store.definitions.deploy(d)
    early = await store.tasks.submit(d, [{"ref": [1]}, {"ref": 7}, {}])
    await store.events.emit("thing.done", {"ref": [1, 2, 3]})
    await store.events.emit("thing.done", {"ref": 7.0})
    await store.events.emit("thing.done", {"ref": None})
    await drain(store, LOOSE)
    assert [(await store.tasks.get(i)).state for i in early] == ["waiting"] * 3
    late = await store.events.emit("thing.done", {"ref": None})
    assert late.delivered == (), late
    exact = await store.events.emit("thing.done", {"ref": [1]})
    assert exact.delivered == (early[0],), exact
    await drain(store, LOOSE)
    assert (await store.tasks.get(early[0])).result == {"ref": [1]}


async def test_two_definitions_with_one_start_key_each_start_a_task(store: Store) -> None:
    """Regression (a user's report): the start key was the task's key in the tenant, so the
    second definition's trigger found the first's task and started nothing."""
    await store.definitions.deploy(definition(ORDER))
    await store.definitions.deploy(definition(ORDER.replace("order-flow", "order-audit")))
    done = await store.events.emit("order.placed", {"order_id": "o-1", "total": 5})
    assert len(done.started) == 2 and done.delivered == (), done
    keys = {(await store.tasks.get(i)).idempotency_key for i in done.started}
    assert keys == {"order-flow:o-1", "order-audit:o-1"}
    # A retired version starts nothing, as a submit of it is refused.
    await store.definitions.retire("order-audit", 1)
    done = await store.events.emit("order.placed", {"order_id": "o-2", "total": 5})
    assert len(done.started) == 1, done


async def test_an_event_a_task_found_when_it_subscribed_records_the_task(store: Store) -> None:
    d = definition(ORDER)
    await store.definitions.deploy(d)
    (task_id,) = await store.tasks.submit(d, [{"order_id": "o-5"}])
    paid = await store.events.emit("payment.settled", {"order_id": "o-5"})
    await drain(store, ORDER)
    (event,) = [e for e in await store.events.list() if e.id == paid.event_id]
    assert event.delivered == (task_id,), event
