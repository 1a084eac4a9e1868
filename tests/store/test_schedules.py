"""Schedules in the store: made with checked fields, fired once per tick by any number of
firing passes at once, paused, resumed, triggered, backfilled; delayed starts."""

from __future__ import annotations

import datetime
from typing import Any

import anyio
import pytest

from tests.helpers.inprocess import deploy_submit, drain, make_due, sql
from tests.helpers.workflows import definition
from toolkit.errors import InputError, UnknownDefinition
from toolkit.store import Store
from toolkit.store.schedules import UnknownSchedule, tick_key

pytestmark = pytest.mark.anyio

NIGHTLY = """
name: nightly
version: 1
input:
  type: object
  required: [day]
  properties: {day: {type: string}, source: {type: string}}
start: run
steps:
  run: {effect: count.work, idempotent: true, args: {value: "${ input.day }"}}
"""

FAILING = """
name: failing
version: 1
input: {type: object}
start: boom
steps:
  boom: {effect: count.fail, idempotent: true, retry: {max_attempts: 1}}
"""

INPUT = {"day": "${ context.scheduled_at }", "source": "${ context.schedule }"}


async def _deployed(store: Store, text: str = NIGHTLY) -> None:
    await store.definitions.deploy(definition(text))


async def _back(store: Store, name: str, seconds: float) -> None:
    """Row surgery: the schedule's next tick moves ``seconds`` into the past (no sleeping)."""
    await sql(
        store,
        "UPDATE toolkit_schedules SET next_tick = toolkit_seconds_after(next_tick, -%s::float8)"
        " WHERE name = %s",
        seconds,
        name,
    )


async def _runs(store: Store, name: str) -> list[tuple[Any, ...]]:
    return await sql(
        store,
        "SELECT scheduled_at, idempotency_key, definition_version, input FROM toolkit_tasks"
        " WHERE schedule_name = %s ORDER BY scheduled_at",
        name,
    )


@pytest.mark.parametrize(
    ("fields", "path", "message"),
    [
        ({"cron": "61 * * * *"}, "$.cron", "minute"),
        ({"cron": "0 2 * * *", "timezone": "Europe/Amsterdm"}, "$.timezone", "Europe/Amsterdam"),
        ({"every": "500ms"}, "$.every", "at least 1 second"),
        ({"every": "1m", "overlap": "queue"}, "$.overlap", "one of skip"),
        ({"every": "1m", "catchup": "all"}, "$.catchup", "takes a window"),
        ({"every": "1m", "input": {"day": 5}}, "$.input.day", "input schema"),
        ({"every": "1m", "input": {}}, "$.input", 'missing required field "day"'),
        ({"every": "1m", "tags": {"bad key": "x"}}, "$.tags", "tag key"),
    ],
)
async def test_a_bad_field_is_refused_naming_it(
    store: Store, fields: dict[str, Any], path: str, message: str
) -> None:
    await _deployed(store)
    with pytest.raises(InputError) as caught:
        await store.schedules.create("nightly-report", "nightly", **{"input": INPUT, **fields})
    assert caught.value.path == path, caught.value
    assert message in caught.value.message, caught.value.message
    assert await store.schedules.list() == []


async def test_a_schedule_of_a_definition_not_deployed_is_refused(store: Store) -> None:
    with pytest.raises(UnknownDefinition):
        await store.schedules.create("x", "nowhere", every="1m")
    with pytest.raises(InputError, match="is not one"):
        await store.schedules.create("-x", "nowhere", every="1m")


async def test_each_tick_starts_one_task_however_many_passes_fire_at_once(store: Store) -> None:
    await _deployed(store)
    made = await store.schedules.create(
        "every-second", "nightly", every="1s", input=INPUT, overlap="allow_all"
    )
    assert made.owner == "store" and made.describe().startswith("every 1s starts nightly")
    await _back(store, "every-second", 20)  # twenty ticks due, all late (not missed)

    async def passes() -> None:
        for _ in range(5):
            await store.schedules.fire_due(["nightly"])

    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(passes)
    runs = await _runs(store, "every-second")
    ticks = [run[0] for run in runs]
    assert len(ticks) == len(set(ticks)) >= 20, runs
    assert all(key == tick_key("every-second", tick) for tick, key, *_ in runs)
    assert runs[0][3] == {"day": runs[0][0].isoformat(), "source": "every-second"}
    schedule = await store.schedules.get("every-second")
    assert schedule.fired == len(runs) and schedule.last_tick == ticks[-1]


async def test_catch_up_latest_fires_the_newest_missed_tick(store: Store) -> None:
    await _deployed(store)
    await store.schedules.create(
        "minutely", "nightly", every="1m", input=INPUT, overlap="allow_all"
    )
    await _back(store, "minutely", 10 * 60)  # ten minutes down
    (fired,) = await store.schedules.fire_due(["nightly"])
    assert len(fired.task_ids) in (1, 2), fired  # the newest missed, and one late if any
    schedule = await store.schedules.get("minutely")
    assert schedule.missed + schedule.caught_up + len(fired.task_ids) - schedule.caught_up >= 10
    assert schedule.caught_up == 1


async def test_skip_starts_no_second_live_run(store: Store) -> None:
    await _deployed(store)
    await store.schedules.create("slow", "nightly", every="1m", input=INPUT)
    await _back(store, "slow", 61)
    (first,) = await store.schedules.fire_due(["nightly"])
    assert len(first.task_ids) == 1
    await _back(store, "slow", 61)
    (second,) = await store.schedules.fire_due(["nightly"])
    assert second.task_ids == () and second.plan.skipped >= 1
    assert (await store.schedules.get("slow")).live == 1


async def test_pause_resume_trigger_and_delete(store: Store) -> None:
    await _deployed(store)
    await store.schedules.create("ops", "nightly", every="1m", input=INPUT)
    paused = await store.schedules.pause("ops", "maintenance")
    assert paused.paused and paused.pause_note == "maintenance"
    await _back(store, "ops", 300)
    assert await store.schedules.fire_due(["nightly"]) == []
    task_id = await store.schedules.trigger("ops")  # a paused schedule can still be triggered
    assert (await store.tasks.get(task_id)).tags == {}
    resumed = await store.schedules.resume("ops")
    assert not resumed.paused and resumed.next_tick > await store.tasks.database_now()
    await store.schedules.delete("ops")
    assert (await store.tasks.get(task_id)).state == "queued"  # its run goes on
    with pytest.raises(UnknownSchedule, match="there is no schedule 'ops'"):
        await store.schedules.get("ops")


async def test_backfill_fires_each_tick_of_a_range_once(store: Store) -> None:
    await _deployed(store)
    await store.schedules.create("hourly", "nightly", cron="0 * * * *", input=INPUT)
    end = datetime.datetime(2026, 11, 30, 6, 0, tzinfo=datetime.UTC)
    start = end - datetime.timedelta(hours=6)
    first = await store.schedules.backfill("hourly", start, end)
    again = await store.schedules.backfill("hourly", start, end)
    assert len(first) == 6 and again == []
    assert [run[0].hour for run in await _runs(store, "hourly")] == [1, 2, 3, 4, 5, 6]


async def test_a_schedule_pauses_after_consecutive_failures(store: Store) -> None:
    await _deployed(store, FAILING)
    await store.schedules.create("flaky", "failing", every="1m", pause_after_failures=2)
    for _ in range(2):
        await store.schedules.trigger("flaky")
        await drain(store, FAILING)
    schedule = await store.schedules.get("flaky")
    assert schedule.paused and schedule.consecutive_failures == 2
    assert schedule.pause_note is not None and "2 consecutive failures" in schedule.pause_note


async def test_a_delayed_start_waits_for_its_time(store: Store) -> None:
    (task_id,) = await deploy_submit(store, NIGHTLY, [{"day": "x"}], delay=3600)
    report = await drain(store, NIGHTLY)
    assert report.claimed == 0
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason) == ("waiting", "start"), task
    assert task.run_at > task.created_at + datetime.timedelta(minutes=59)
    await make_due(store, task_id)  # its time has come: it starts like any task
    await drain(store, NIGHTLY)
    assert (await store.tasks.get(task_id)).state == "succeeded"
    with pytest.raises(InputError, match="not both"):
        await deploy_submit(store, NIGHTLY, [{"day": "x"}], delay=1,
                            start_at=datetime.datetime.now(datetime.UTC))  # fmt: skip
