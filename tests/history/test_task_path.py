"""A task's path through its definition: what happened to each step (``toolkit.history.
task_path``), from real runs against PostgreSQL — succeeded, failed at a step, waiting for a
signal, a step entered twice, a compensated saga with a caught parallel step, a deadline,
tasks at their cursor — and the TaskBrowser's drawing of it (the drawing itself: ``tests/definition/
test_svg.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.inprocess import deploy_submit, drain, make_due, sql
from tests.helpers.workflows import THREE_STEPS, TIMER, definition
from toolkit.checkpoint import BranchFrame, Checkpoint, Compensable, Compensation
from toolkit.history.notebook import TaskBrowser, TaskDetail
from toolkit.history.task_path import StepMark, task_path, top_step
from toolkit.lifecycle import StepStatus
from toolkit.store import Store

pytestmark = pytest.mark.anyio

DONE, CURRENT, FAILED = StepStatus.DONE, StepStatus.CURRENT, StepStatus.FAILED
WAITING, COMPENSATED = StepStatus.WAITING, StepStatus.COMPENSATED
NOT_REACHED = StepStatus.NOT_REACHED


async def path_of(store: Store, text: str, task_id: int) -> dict[str, StepMark]:
    task = await store.tasks.get(task_id)
    events = await store.tasks.events(task_id)
    evidence = await store.tasks.evidence(task_id)
    return task_path(task, events, evidence, definition(text))


def statuses(path: dict[str, StepMark]) -> dict[str, str]:
    return {step: str(mark.status) for step, mark in path.items()}


def test_an_occurrence_belongs_to_a_step_of_the_task() -> None:
    assert top_step("charge#2") == ("charge", False)
    assert top_step("fan#1/a/charge#1") == ("fan", False)
    assert top_step("compensate/charge#1/charge#1") == ("charge", True)
    assert top_step("compensate/fan#1/") == ("fan", True)  # a compensation frame's prefix
    assert top_step("compensate#1") == ("compensate", False)  # a step named so


async def test_a_succeeded_task_is_done_along_its_path_and_grey_elsewhere(store: Store) -> None:
    (task_id,) = await deploy_submit(store, THREE_STEPS, [{"n": 1}])
    await drain(store, THREE_STEPS)
    path = await path_of(store, THREE_STEPS, task_id)
    assert list(path) == ["first", "second", "route", "zero", "third"]  # document order
    assert statuses(path) == {
        "first": DONE, "second": DONE, "route": DONE, "zero": NOT_REACHED, "third": DONE,
    }  # fmt: skip
    assert path["second"].note == "second#1 completed at attempt 1"
    assert path["zero"].note == ""


FAILING = """
name: path-failing
version: 1
start: first
steps:
  first: {effect: count.work, idempotent: true, next: broken}
  broken:
    effect: count.fail
    idempotent: true
    args: {error: Nope}
    retry: {max_attempts: 2, initial: 10ms}
    next: never
  never: {succeed: {output: no}}
"""


async def test_the_step_that_failed_the_task_is_failed(store: Store) -> None:
    (task_id,) = await deploy_submit(store, FAILING, [{}])
    await drain(store, FAILING)
    assert (await store.tasks.get(task_id)).state == "failed"
    path = await path_of(store, FAILING, task_id)
    assert statuses(path) == {"first": DONE, "broken": FAILED, "never": NOT_REACHED}
    assert path["broken"].note == "the task failed here (Nope); broken#1 failed at attempt 2"


LOOP = """
name: path-loop
version: 1
start: prepare
steps:
  prepare: {effect: count.work, idempotent: true, next: hold}
  hold: {wait: {signal: go}, next: route}
  route:
    choice: [{when: "${ steps.hold.again }", next: hold}]
    default: done
  done: {succeed: {output: ok}}
"""


async def test_a_waiting_task_waits_at_its_step_and_the_latest_entry_decides(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, LOOP, [{}])
    await drain(store, LOOP)
    path = await path_of(store, LOOP, task_id)
    assert statuses(path) == {
        "prepare": DONE, "hold": WAITING, "route": NOT_REACHED, "done": NOT_REACHED,
    }  # fmt: skip
    assert path["hold"].note == "the task waits here (signal)"

    # Round the loop: `hold` is entered a second time and waits again; `route` is done.
    await store.tasks.signal(task_id, "go", {"again": True})
    await drain(store, LOOP)
    path = await path_of(store, LOOP, task_id)
    assert statuses(path) == {
        "prepare": DONE, "hold": WAITING, "route": DONE, "done": NOT_REACHED,
    }  # fmt: skip
    assert path["hold"].note == "the task waits here (signal); entered 2 times"

    await store.tasks.signal(task_id, "go", {"again": False})
    await drain(store, LOOP)
    path = await path_of(store, LOOP, task_id)
    assert set(statuses(path).values()) == {DONE}
    assert path["hold"].note == "entered 2 times"


SAGA = """
name: path-saga
version: 1
start: reserve
steps:
  reserve:
    effect: count.work
    idempotent: true
    compensate: {effect: count.work, args: {value: released}}
    next: fan
  fan:
    parallel:
      branches:
        fine:
          start: x
          steps:
            x: {effect: count.work, idempotent: true}
        broken:
          start: y
          steps:
            y: {effect: count.fail, idempotent: true, args: {error: Nope}, retry: {max_attempts: 1}}
    catch: [{errors: [Nope], next: ship}]
    next: ship
  ship:
    effect: count.fail
    idempotent: true
    args: {error: NoCourier}
    retry: {max_attempts: 1}
"""


async def test_a_compensated_saga_and_a_caught_parallel_step(store: Store) -> None:
    (task_id,) = await deploy_submit(store, SAGA, [{}])
    await drain(store, SAGA)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["compensation"] == "completed"
    path = await path_of(store, SAGA, task_id)
    assert statuses(path) == {"reserve": COMPENSATED, "fan": FAILED, "ship": FAILED}
    assert path["reserve"].note == "compensated by count.work; reserve#1 completed at attempt 1"
    # The parallel step's branch failed and its catch rule went on: failed, with its branches.
    assert path["fan"].note == "Nope, caught: went to ship; 2 branches (1 succeeded, 1 failed)"
    assert path["ship"].note == "the task failed here (NoCourier); ship#1 failed at attempt 1"


async def test_a_compensation_in_progress_is_where_the_task_is(store: Store) -> None:
    (task_id,) = await deploy_submit(store, SAGA, [{}])
    await drain(store, SAGA)
    ended = await store.tasks.get(task_id)
    # The same task at the moment its compensation of `reserve` waits for reconciliation
    # (what a crash during a non-idempotent compensation leaves): its checkpoint then.
    undo = Compensable("reserve", "reserve#1", "count.work", False, {"value": "released"})
    frame = BranchFrame.start("reserve", "compensate/reserve#1/")
    frame.pending = "compensate/reserve#1/reserve#1"
    checkpoint = Checkpoint.from_json(ended.checkpoint)
    checkpoint.cursor, checkpoint.compensable = "ship", [undo]
    checkpoint.compensating = Compensation({"name": "NoCourier", "step": "ship"}, frame=frame)
    midway = dataclasses.replace(
        ended, state="waiting", wait_reason="reconciliation", error=None, result=None,
        checkpoint=checkpoint.to_json(),
    )  # fmt: skip
    events = [e for e in await store.tasks.events(task_id) if e["kind"] != "compensated"]
    path = task_path(midway, events, await store.tasks.evidence(task_id), definition(SAGA))
    assert statuses(path) == {"reserve": WAITING, "fan": FAILED, "ship": FAILED}
    assert path["reserve"].note == "its compensation waits (reconciliation)"
    assert path["ship"].note.startswith(
        "the task failed here (NoCourier), compensating the steps before it"
    )


DEADLINE = """
name: path-deadline
version: 1
timeout: 1h
on_timeout: late
start: hold
steps:
  hold: {wait: {signal: never}, next: done}
  done: {succeed: {output: done}}
  late: {succeed: {output: late}}
"""


async def test_a_step_the_deadline_abandoned_is_failed_and_on_timeout_done(
    store: Store,
) -> None:
    (task_id,) = await deploy_submit(store, DEADLINE, [{}])
    await drain(store, DEADLINE)
    await sql(store, "UPDATE toolkit_tasks SET deadline_at = statement_timestamp() WHERE id = %s",
              task_id)  # fmt: skip
    await make_due(store, task_id)
    await drain(store, DEADLINE)
    assert (await store.tasks.get(task_id)).result == "late"
    path = await path_of(store, DEADLINE, task_id)
    assert statuses(path) == {"hold": FAILED, "done": NOT_REACHED, "late": DONE}
    assert path["hold"].note == "the workflow deadline passed here"


async def test_a_task_is_at_its_cursor_queued_leased_or_waiting_for_a_timer(
    store: Store,
) -> None:
    queued, leased = await deploy_submit(store, THREE_STEPS, [{"n": 1}, {"n": 2}])
    path = await path_of(store, THREE_STEPS, queued)
    assert path["first"] == StepMark(CURRENT, "the task's next step (queued)")
    assert {s for step, s in statuses(path).items() if step != "first"} == {NOT_REACHED}

    digest = definition(THREE_STEPS).digest
    claimed = await store.leases.claim("path-test", [digest], limit=2, lease_seconds=30)
    assert {c.id for c in claimed} == {queued, leased}
    path = await path_of(store, THREE_STEPS, leased)
    assert path["first"] == StepMark(CURRENT, "running now (leased)")

    (timer,) = await deploy_submit(store, TIMER, [{}])
    await drain(store, TIMER)
    path = await path_of(store, TIMER, timer)
    assert statuses(path) == {"pause": WAITING, "after": NOT_REACHED}
    assert path["pause"].note == "the task waits here (timer)"

    # A cancelled task stopped at its cursor.
    await store.tasks.cancel(timer, "not needed")
    path = await path_of(store, TIMER, timer)
    assert path["pause"] == StepMark(CURRENT, "the task was cancelled here")


# --- the browser draws it ---------------------------------------------------------------------


async def test_the_browser_draws_the_path_and_keeps_the_text(store: Store) -> None:
    (task_id,) = await deploy_submit(store, LOOP, [{}])
    await drain(store, LOOP)
    browser = TaskBrowser(store)
    await browser.refresh()
    detail = await browser.open(task_id)
    assert detail.definition == definition(LOOP)  # the version the task is pinned to
    assert detail.path is not None and detail.path["hold"].status == WAITING
    pane = browser.detail_pane.value
    # After the fields, before the tables: the drawing, each step in its status' colour.
    fields, drawing, tables = pane.index("claims"), pane.index("<svg"), pane.index("timeline")
    assert fields < drawing < tables, pane
    assert "data-step='hold' data-status='waiting'" in pane
    assert "data-step='done' data-status='not_reached'" in pane
    assert "toolkit-legend" in pane and ">compensated</text>" in pane
    assert "<script" not in pane and "http" not in pane.replace("http://www.w3.org/2000/svg", "")
    # The text is what it was without the drawing (docs and tutorials compare it).
    plain = TaskDetail(detail.task, detail.events, detail.evidence, detail.signals)
    assert detail.text() == plain.text() and plain.path is None
    assert "<svg" not in plain.html()


async def test_a_definition_no_longer_registered_shows_no_drawing(store: Store) -> None:
    (task_id,) = await deploy_submit(store, THREE_STEPS, [{"n": 1}])
    await drain(store, THREE_STEPS)
    await store.definitions.delete("three-steps", 1)  # allowed: its only task has ended
    browser = TaskBrowser(store)
    detail = await browser.open(task_id)
    assert detail.definition is None and detail.path is None
    assert "<svg" not in browser.detail_pane.value
    assert "task " + str(task_id) in browser.detail_pane.value
