"""Schedules a definition declares: deploys of its newest version make, change and remove
them, a re-deploy changes nothing, and a deploy that would break a schedule is refused."""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import drain
from tests.helpers.workflows import definition
from tests.store.test_schedules import FAILING
from toolkit.definition.cadence import CronCadence, IntervalCadence
from toolkit.errors import InputError, ScheduleConflict, UnknownDefinition
from toolkit.store import Store

pytestmark = pytest.mark.anyio

REPORT = """
name: report
version: {version}
input:
  type: object
  required: [day]
  properties: {{day: {{type: string}}{extra}}}
start: run
steps:
  run: {{effect: count.work, idempotent: true, args: {{value: "${{ input.day }}"}}}}
{schedules}
"""

NIGHTLY = """schedules:
  - name: report.nightly
    cron: "30 2 * * *"
    timezone: Europe/Amsterdam
    input: {day: "${ context.scheduled_at }"}
    tags: {team: data}
    pause_after_failures: 3
"""
HOURLY = """  - name: report.hourly
    every: 1h
    input: {day: hourly}
"""


def _report(version: int, schedules: str = "", extra: str = "") -> str:
    return REPORT.format(version=version, schedules=schedules, extra=extra)


async def _state(store: Store) -> dict[str, tuple[object, ...]]:
    return {
        s.name: (s.owner, s.owner_version, s.cadence, s.next_tick, s.updated_at, s.paused)
        for s in await store.schedules.list()
    }


def test_the_model_holds_the_declared_schedules() -> None:
    (nightly, hourly) = definition(_report(1, NIGHTLY + HOURLY)).schedules
    assert nightly.cadence == CronCadence("30 2 * * *", "Europe/Amsterdam")
    assert (nightly.overlap, nightly.catchup, nightly.pause_after_failures) == ("skip", "latest", 3)
    assert hourly.cadence == IntervalCadence(3600.0, 0.0) and hourly.input == {"day": "hourly"}


async def test_deploying_makes_them_and_a_re_deploy_changes_nothing(store: Store) -> None:
    v1 = definition(_report(1, NIGHTLY + HOURLY))
    assert await store.definitions.deploy(v1) == "registered"
    made = await _state(store)
    assert {name: row[:2] for name, row in made.items()} == {
        "report.hourly": ("definition", 1),
        "report.nightly": ("definition", 1),
    }
    assert await store.definitions.deploy(v1) == "unchanged"
    assert await store.definitions.deploy_all([v1]) == ["unchanged"]
    assert await _state(store) == made  # not even updated_at moved


async def test_a_new_version_changes_adds_and_removes_them(store: Store) -> None:
    await store.definitions.deploy(definition(_report(1, NIGHTLY + HOURLY)))
    await store.schedules.pause("report.nightly", "holiday")
    before = await store.schedules.get("report.nightly")
    changed = (
        NIGHTLY.replace("30 2", "45 3")
        + """  - name: report.weekly
    cron: "@weekly"
    input: {day: weekly}
"""
    )
    await store.definitions.deploy(definition(_report(2, changed)))
    after = {s.name: s for s in await store.schedules.list()}
    assert sorted(after) == ["report.nightly", "report.weekly"], after  # hourly is removed
    nightly = after["report.nightly"]
    assert nightly.cadence == CronCadence("45 3 * * *", "Europe/Amsterdam")
    assert (nightly.owner_version, nightly.paused, nightly.pause_note) == (2, True, "holiday")
    assert nightly.next_tick != before.next_tick  # a new cadence starts from its next tick
    # An older version deployed again (a stale worker) declares nothing that applies.
    await store.definitions.deploy(definition(_report(1, NIGHTLY + HOURLY)))
    assert sorted(s.name for s in await store.schedules.list()) == sorted(after)
    # A version without schedules removes them all.
    await store.definitions.deploy(definition(_report(3)))
    assert await store.schedules.list() == []


async def test_a_declared_schedule_is_paused_and_triggered_but_not_edited(store: Store) -> None:
    await store.definitions.deploy(definition(_report(1, NIGHTLY)))
    with pytest.raises(InputError, match=r"declared by report v1: change it in that YAML"):
        await store.schedules.update("report.nightly", every="1h")
    with pytest.raises(InputError, match=r"declared by report v1: remove it from that YAML"):
        await store.schedules.delete("report.nightly")
    assert (await store.schedules.pause("report.nightly", "x")).paused
    assert not (await store.schedules.resume("report.nightly")).paused
    task = await store.tasks.get(await store.schedules.trigger("report.nightly"))
    assert (task.schedule_name, task.tags) == ("report.nightly", {"team": "data"}), task


async def test_a_new_input_schema_that_refuses_a_schedule_is_not_deployed(store: Store) -> None:
    await store.definitions.deploy(definition(_report(1)))
    await store.schedules.create("ops", "report", every="1m", input={"day": "x"})
    stricter = _report(2, extra=", region: {type: string}").replace(
        "required: [day]", "required: [day, region]"
    )
    with pytest.raises(ScheduleConflict) as refused:
        await store.definitions.deploy(definition(stricter))
    assert "schedule 'ops'" in refused.value.message, refused.value.message
    assert 'missing required field "region"' in refused.value.message
    assert "toolkit schedules update ops --input" in refused.value.message
    with pytest.raises(UnknownDefinition):
        await store.definitions.get("report", 2)
    # Nothing of a batch is registered either.
    with pytest.raises(ScheduleConflict):
        await store.definitions.deploy_all([definition(FAILING), definition(stricter)])
    with pytest.raises(UnknownDefinition):
        await store.definitions.get("failing", 1)


async def test_a_declared_name_another_schedule_holds_is_refused(store: Store) -> None:
    await store.definitions.deploy(definition(_report(1)))
    await store.schedules.create("report.nightly", "report", every="1m", input={"day": "x"})
    with pytest.raises(ScheduleConflict, match=r"'report\.nightly' was made at run time"):
        await store.definitions.deploy(definition(_report(2, NIGHTLY)))
    other = FAILING.replace("name: failing", "name: other") + NIGHTLY.replace(
        'input: {day: "${ context.scheduled_at }"}', "input: {}"
    )
    with pytest.raises(ScheduleConflict, match="declared by both report and other"):
        await store.definitions.deploy_all(
            [definition(_report(3, NIGHTLY.replace("report.nightly", "shared"))),
             definition(other.replace("report.nightly", "shared"))]
        )  # fmt: skip


async def test_a_failed_run_without_a_pause_limit_ends_failed(store: Store) -> None:
    """Regression: 0010's outcome trigger set ``paused`` to NULL when the schedule had no
    pause_after_failures, and the NOT NULL refusal kept the run from ending (fixed by 0011)."""
    await store.definitions.deploy(definition(FAILING))
    await store.schedules.create("flaky", "failing", every="1d")
    task_id = await store.schedules.trigger("flaky")
    await drain(store, FAILING)
    task = await store.tasks.get(task_id)
    events = [event["kind"] for event in await store.tasks.events(task_id)]
    assert task.state == "failed", (task, events)
    schedule = await store.schedules.get("flaky")
    assert (schedule.paused, schedule.consecutive_failures) == (False, 1), schedule
