"""Debounce and throttle of submissions against a real PostgreSQL (docs/flow-control.md)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.inprocess import sql
from tests.helpers.processes import eventually
from tests.helpers.workflows import definition
from toolkit.definition import WorkflowDefinition
from toolkit.errors import DefinitionError, InputError, Throttled
from toolkit.history.retention import prune
from toolkit.store import Store

pytestmark = pytest.mark.anyio

DEBOUNCED = """
name: debounced
version: 1
input: {type: object}
debounce: {key: "${ input.document }", quiet: QUIET, max_wait: MAX_WAIT}
start: index
steps:
  index: {effect: count.work, idempotent: true}
"""


def throttled(rate: str, excess: str = "delay") -> str:
    return f"""
name: throttled
version: 1
input: {{type: object}}
throttle: {{key: "${{ input.customer }}", rate: {rate}, excess: {excess}}}
start: call
steps:
  call: {{effect: count.work, idempotent: true}}
"""


async def _deployed(store: Store, text: str) -> WorkflowDefinition:
    d = definition(text)
    await store.definitions.deploy(d)
    return d


async def _rows(store: Store, ids: list[int]) -> list[tuple[Any, ...]]:
    return await sql(
        store,
        "SELECT id, state, wait_reason, input, round(extract(epoch FROM run_at - created_at))"
        " FROM toolkit_tasks WHERE id = ANY(%s) ORDER BY id",
        sorted(set(ids)),
    )


async def test_twenty_submits_of_one_key_start_one_task_with_the_last_input(store: Store) -> None:
    d = await _deployed(store, DEBOUNCED.replace("QUIET", "5s").replace("MAX_WAIT", "1m"))
    ids = []
    for n in range(20):
        ids += await store.tasks.submit(d, [{"document": "a", "n": n}])
    ids += await store.tasks.submit(d, [{"document": "b", "n": 0}])
    assert len(set(ids[:20])) == 1 and ids[20] != ids[0], ids
    rows = await _rows(store, ids)
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("waiting", "debounce", {"document": "a", "n": 19}),
        ("waiting", "debounce", {"document": "b", "n": 0}),
    ], rows
    kinds = await sql(
        store, "SELECT kind, count(*) FROM toolkit_task_events WHERE task_id = %s GROUP BY 1"
        " ORDER BY 1", ids[0],
    )  # fmt: skip
    assert kinds == [("debounced", 19), ("submitted", 1)]
    assert await store.leases.claim("w", [d.digest], 10, 30) == []  # quiet for 5 s yet


async def test_a_burst_starts_by_max_wait_however_often_it_is_submitted(store: Store) -> None:
    d = await _deployed(store, DEBOUNCED.replace("QUIET", "1h").replace("MAX_WAIT", "2s"))
    (task_id,) = await store.tasks.submit(d, [{"document": "a"}])
    await store.tasks.submit(d, [{"document": "a", "again": True}])
    assert (await _rows(store, [task_id]))[0][4] == 2  # run_at = first submit + max_wait


async def test_a_submit_after_the_task_started_makes_a_new_task(store: Store) -> None:
    d = await _deployed(store, DEBOUNCED.replace("QUIET", "0.2s").replace("MAX_WAIT", "1m"))
    (first,) = await store.tasks.submit(d, [{"document": "a"}])
    claimed = []

    async def claimed_once_quiet() -> bool:
        claimed.extend(await store.leases.claim("w", [d.digest], 10, 30))
        return bool(claimed)

    await eventually(claimed_once_quiet, timeout=10, what="the debounced task claimed")
    assert [task.id for task in claimed] == [first]
    assert claimed[0].input == {"document": "a"}
    (second,) = await store.tasks.submit(d, [{"document": "a", "later": True}])
    assert second != first


async def test_a_throttle_starts_a_burst_at_once_and_spaces_the_rest(store: Store) -> None:
    d = await _deployed(store, throttled("2/min"))
    ids = await store.tasks.submit(d, [{"customer": "c"}] * 4 + [{"customer": "other"}])
    rows = await _rows(store, ids)
    # 2 at once, then one every 30 s; another customer is not held back
    assert [(r[1], r[4]) for r in rows] == [
        ("queued", 0), ("queued", 0), ("waiting", 30), ("waiting", 60), ("queued", 0),
    ], rows  # fmt: skip


async def test_a_throttle_that_refuses_says_when_a_start_is_free(store: Store) -> None:
    d = await _deployed(store, throttled("1/h", "refuse"))
    assert await store.tasks.submit(d, [{"customer": "c"}])
    with pytest.raises(Throttled, match=r"throttle key 'c' is past its rate") as info:
        await store.tasks.submit(d, [{"customer": "c"}])
    assert 3590 < info.value.retry_after <= 3600
    assert await store.tasks.submit(d, [{"customer": "d"}])
    assert (await store.tasks.count(definition="throttled")) == 2


async def test_no_delayed_start_with_debounce_or_throttle(store: Store) -> None:
    d = await _deployed(store, throttled("1/s"))
    with pytest.raises(InputError, match="declares throttle, which decides when its tasks"):
        await store.tasks.submit(d, [{"customer": "c"}], delay=5)


def test_debounce_cannot_be_combined_with_a_concurrency_key() -> None:
    text = DEBOUNCED.replace("QUIET", "5s").replace("MAX_WAIT", "1m").replace(
        "start: index", 'concurrency: {key: "${ input.document }"}\nstart: index'
    )
    with pytest.raises(DefinitionError, match="debounce cannot be combined with concurrency"):
        definition(text)


def test_a_throttle_rate_of_no_start_is_refused() -> None:
    with pytest.raises(DefinitionError, match="is not a rate like"):
        definition(throttled("0/min"))


async def test_events_of_a_debounced_trigger_start_one_task_per_burst(store: Store) -> None:
    text = DEBOUNCED.replace("QUIET", "5s").replace("MAX_WAIT", "1m").replace(
        "start: index", "triggers: [{event: doc.changed}]\nstart: index"
    )
    await _deployed(store, text)
    emitted = [await store.events.emit("doc.changed", {"document": "a", "n": n}) for n in range(5)]
    assert [len(e.started) for e in emitted] == [1, 0, 0, 0, 0]
    (task_id,) = emitted[0].started
    assert (await store.tasks.get(task_id)).input == {"document": "a", "n": 4}


async def test_prune_deletes_the_throttle_keys_whose_next_start_has_passed(store: Store) -> None:
    """Such a key holds no state: a submit after the prune starts as it would have before."""
    d = await _deployed(store, throttled("1/h"))
    await store.tasks.submit(d, [{"customer": c} for c in ("a", "b", "c")])
    await sql(
        store, "UPDATE toolkit_throttle_keys SET next_at = now() - interval '1 s'"
        " WHERE throttle_key <> %s RETURNING 1", "c",
    )  # fmt: skip
    report = await prune(store.db, older_than=3600, batch_size=1)
    assert report.throttle_keys == 2 and report.tasks == 0, report
    keys = await sql(store, "SELECT throttle_key FROM toolkit_throttle_keys")
    assert keys == [("c",)], keys
    (again,) = await store.tasks.submit(d, [{"customer": "a"}])
    (late,) = await store.tasks.submit(d, [{"customer": "c"}])
    assert (await store.tasks.get(again)).state == "queued"  # starts now, as a new key
    assert (await store.tasks.get(late)).state == "waiting"  # c still throttled
