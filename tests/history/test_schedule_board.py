"""The schedule board: each schedule's next fire times (from its cadence, in database time),
its ticks and recent runs; its buttons pause, resume and trigger it through the store and
filter a TaskBrowser to its runs (the TaskBrowser's schedule field)."""

from __future__ import annotations

import datetime
import itertools
from zoneinfo import ZoneInfo

import pytest

from tests.helpers.history import deploy, run_until_idle
from tests.helpers.inprocess import sql
from tests.helpers.workflows import BROKEN, DEFINITIONS, FLOW, WAITER
from toolkit.errors import ConfigError
from toolkit.history.notebook import ScheduleBoard, TaskBrowser
from toolkit.store import Store

pytestmark = pytest.mark.anyio

AMSTERDAM = ZoneInfo("Europe/Amsterdam")


async def _two_schedules(store: Store) -> dict[str, list[int]]:
    """``weekday`` (a cron, two runs that succeed) and ``daily`` (an interval, one that fails),
    and a task no schedule started; the ids of each's runs, oldest first."""
    await deploy(store)
    await store.schedules.create(
        "weekday", FLOW.name, cron="0 6 * * MON-FRI", timezone="Europe/Amsterdam",
        input={"n": 1}, tags={"kind": "report"},
    )  # fmt: skip
    await store.schedules.create(
        "daily", BROKEN.name, every="1d", offset="5h", pause_after_failures=3
    )
    runs = {
        "weekday": [await store.schedules.trigger("weekday") for _ in range(2)],
        "daily": [await store.schedules.trigger("daily")],
        "none": await store.tasks.submit(FLOW, [{"n": 2}]),
    }
    await run_until_idle(store, DEFINITIONS)
    return runs


async def test_each_row_shows_the_next_fires_of_its_cadence_and_its_runs(store: Store) -> None:
    runs = await _two_schedules(store)
    board = ScheduleBoard(store, upcoming=4, runs=5)
    rows = await board.refresh()
    assert [row.name for row in rows] == ["daily", "weekday"] and board.status == "2 schedules"

    weekday = board.row("weekday")
    stored = await store.schedules.get("weekday")
    # The next fires: its next tick, then the cadence's ticks, all after the database's now,
    # each a weekday's 06:00 in Amsterdam.
    assert weekday.upcoming[0] == stored.next_tick > weekday.now
    assert list(weekday.upcoming) == stored.cadence.ticks(
        weekday.now, weekday.now + datetime.timedelta(days=10), 4
    )
    local = [tick.astimezone(AMSTERDAM) for tick in weekday.upcoming]
    assert {(t.hour, t.minute) for t in local} == {(6, 0)}
    assert all(t.weekday() < 5 for t in local) and len(set(local)) == 4
    daily = board.row("daily")
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(daily.upcoming)}
    assert gaps == {86400.0} and {t.hour for t in daily.upcoming} == {5}
    assert daily.upcoming[0] - daily.now <= datetime.timedelta(days=1)

    # Recent runs: newest first, with their states; a task no schedule started is nowhere.
    assert [r.id for r in weekday.runs] == runs["weekday"][::-1]
    assert [r.state for r in weekday.runs] == ["succeeded", "succeeded"]
    assert [(r.id, r.state) for r in daily.runs] == [(runs["daily"][0], "failed")]

    text = weekday.text()
    assert text.startswith('schedule weekday: cron "0 6 * * MON-FRI" in Europe/Amsterdam ')
    assert "owner:        store" in text and "state:        active" in text
    assert "fired 2, skipped 0" in text and "live runs 0" in text  # a trigger fires too
    assert f"task {runs['weekday'][1]} succeeded, triggered " in text
    fires = [line for line in text.splitlines() if " 06:00:00 CE" in line]
    assert len(fires) == 4 and "next fires:" in fires[0], text
    assert "time zone UTC" in daily.fields()[1][1]
    assert "1 failed in a row (pauses at 3)" in daily.text()
    # The HTML: the row, the state badge, a badge per run; the time zone's wall clock.
    cells = board.controls["weekday"].cells.value
    assert "data-schedule='weekday'" in cells and "toolkit-schedule-active" in cells
    assert cells.count(">succeeded</span>") == 2 and "06:00:00 CE" in cells
    assert "toolkit-schedule-due" not in cells
    assert list(board.rows_box.children) == [board.controls[n].widget for n in ("daily", "weekday")]

    # Where widgets are not shown, the board is text.
    plain = board._repr_mimebundle_()["text/plain"]
    assert plain.startswith("ScheduleBoard") and "schedule daily: every 1d" in plain
    assert board.listing() in plain


async def test_the_row_counts_ticks_fired_and_skipped_and_marks_a_due_one(store: Store) -> None:
    await deploy(store)
    await store.schedules.create("new-year", WAITER.name, cron="0 0 1 1 *")

    async def due_now() -> None:  # row surgery: its next tick came 10 s ago (no sleeping)
        await sql(
            store,
            "UPDATE toolkit_schedules SET next_tick = statement_timestamp() - interval '10 s'"
            " WHERE name = 'new-year'",
        )

    await due_now()
    board = ScheduleBoard(store)
    [row] = await board.refresh()
    assert row.upcoming[0] < row.now and row.fire_texts()[0].endswith("(due)")
    assert all(t > row.now for t in row.upcoming[1:]) and "toolkit-schedule-due" in row.html()
    assert row.upcoming[1].timetuple()[1:6] == (1, 1, 0, 0, 0)  # January 1st, 00:00 UTC

    [fired] = await store.schedules.fire_due([WAITER.name])
    assert len(fired.task_ids) == 1
    await run_until_idle(store, DEFINITIONS)  # its run waits for a signal: live
    await due_now()
    await store.schedules.fire_due([WAITER.name])  # a tick while a run is live: skipped
    [row] = await board.refresh()
    assert (row.schedule.fired, row.schedule.skipped, row.schedule.live) == (1, 1, 1)
    assert "live runs 1" in row.text() and "fired 1, skipped 1" in row.text()
    assert "missed 0, caught up 0" in row.text()
    [run] = row.runs
    assert run.id == fired.task_ids[0] and row.run_text(run).startswith(
        f"task {run.id} waiting (signal), tick "
    )
    assert f"data-task='{run.id}'" in row.html() and ">waiting</span>" in row.html()


async def test_the_buttons_pause_trigger_and_resume_through_the_store(store: Store) -> None:
    await _two_schedules(store)
    board = ScheduleBoard(store)
    await board.refresh()
    weekday = board.controls["weekday"]
    assert weekday.resume_button.disabled and not weekday.pause_button.disabled
    assert weekday.runs_button.disabled, "no browser: no runs button"

    weekday.note.value = "holidays"
    weekday.pause_button.click()
    await board.settle()
    stored = await store.schedules.get("weekday")
    assert stored.paused and stored.pause_note == "holidays"
    assert board.status == "schedule weekday paused: holidays"
    assert weekday.pause_button.disabled and not weekday.resume_button.disabled
    row = board.row("weekday")
    assert "state:        paused: holidays" in row.text() and "if resumed:" in row.text()
    assert "toolkit-schedule-paused" in weekday.cells.value and "holidays" in weekday.cells.value
    # Paused, it fires nothing: the times shown are those a resume now would go on from, not
    # its next tick, which goes stale while it is paused (row surgery: a week ago).
    await sql(
        store,
        "UPDATE toolkit_schedules SET next_tick = toolkit_seconds_after(next_tick, -7 * 86400)"
        " WHERE name = 'weekday'",
    )
    [_, row] = await board.refresh()
    stale = (await store.schedules.get("weekday")).next_tick
    assert stale < row.now and stale not in row.upcoming
    assert list(row.upcoming) == stored.cadence.ticks(
        row.now, row.now + datetime.timedelta(days=10), 3
    )

    # A trigger starts a run even paused.
    weekday.trigger_button.click()
    await board.settle()
    [newest, *_] = await store.tasks.list(schedule="weekday")
    assert board.status == f"schedule weekday: task {newest.id} started"
    assert newest.state == "queued" and newest.tags["kind"] == "report"
    assert board.row("weekday").runs[0].id == newest.id
    assert f"task {newest.id} queued, triggered" in board.row("weekday").text()

    weekday.resume_button.click()
    await board.settle()
    resumed = await store.schedules.get("weekday")
    assert not resumed.paused and resumed.next_tick > board.row("weekday").now
    assert board.status.startswith("schedule weekday resumed; next tick ")
    assert board.status.endswith(("CET", "CEST")) and " 06:00:00 " in board.status

    # What the store refuses shows in the status line, not as a traceback.
    weekday.runs_button.click()
    await board.settle()
    assert board.status.startswith("error: no task browser: make the board with ScheduleBoard(")
    with pytest.raises(ConfigError):
        await board.show_runs("weekday")
    await store.schedules.delete("weekday")
    weekday.pause_button.click()
    await board.settle()
    assert board.status == "error: there is no schedule 'weekday'"
    # The API calls the same store methods (the note is optional, as in the CLI).
    assert (await board.pause("daily")).pause_note == "paused"
    assert [row.name for row in board.rows] == ["daily"] and "weekday" not in board.controls
    assert (await store.schedules.get("daily")).paused
    assert await board.trigger("daily") > newest.id
    assert not (await board.resume("daily")).paused


async def test_runs_filters_the_browser_to_the_schedule(store: Store) -> None:
    runs = await _two_schedules(store)
    browser = TaskBrowser(store)
    board = ScheduleBoard(store, browser)
    await browser.refresh()
    await board.refresh()
    assert browser.total == 4 and not board.controls["weekday"].runs_button.disabled

    board.controls["weekday"].runs_button.click()
    await board.settle()
    assert [t.id for t in browser.tasks] == runs["weekday"][::-1]
    assert browser.filters.schedule_filter.value == "weekday"
    assert browser.filters.where.schedule == "weekday"
    assert board.status == "the task browser shows the runs of schedule weekday: 2 tasks"
    assert [t.id for t in await board.show_runs("daily")] == runs["daily"]

    # The browser's schedule field, typed in, filters as well; set_filters sets it.
    browser.filters.schedule_filter.value = "weekday"
    await browser.settle()
    assert browser.total == 2 and {t.schedule_name for t in browser.tasks} == {"weekday"}
    browser.set_filters(schedule="daily", state="failed")
    assert [t.id for t in await browser.refresh()] == runs["daily"]
    assert browser.filters.schedule_filter.value == "daily"
    browser.set_filters()
    assert len(await browser.refresh()) == 4 and browser.filters.schedule_filter.value == ""
