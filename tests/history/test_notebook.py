"""Notebook inspection: the task browser filters, opens and acts on tasks through the store,
and the history dashboard plots an export (the drawings: ``tests/definition/test_diagram.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from tests.helpers.golden import EXAMPLES
from tests.helpers.history import deploy, run_until_idle, submit_and_run
from tests.helpers.processes import eventually
from tests.helpers.workflows import DEFINITIONS, FLOW, WAITER
from toolkit import history
from toolkit.application import App
from toolkit.definition import load_definition
from toolkit.history.export import export_history
from toolkit.history.notebook import TaskBrowser, plot_history
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.filters import TaskFilter
from toolkit.store.writes import FencedWrite

# --- the task browser -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_browser_filters_opens_and_acts(store: Store) -> None:
    await deploy(store)
    await submit_and_run(store, flows=2, broken=1)
    waiting = await store.tasks.submit(WAITER, [{}, {}], tenant="acme")
    await run_until_idle(store, DEFINITIONS)

    browser = TaskBrowser(store)
    listed = await browser.refresh()
    assert len(listed) == 5 and browser.status == "5 tasks"
    # Past its limit the list says how many there are (issue 24, item 6).
    few = TaskBrowser(store, limit=2)
    assert len(await few.refresh()) == 2
    assert few.status == "2 tasks (the newest) of 5", few.status
    assert set(browser.filters.tenant_filter.options) == {"(any)", "acme", "globex"}
    offered = set(browser.filters.definition_filter.options)
    assert offered >= {"hist-flow", "hist-broken", "hist-wait"}

    # Filters: through the widgets (the change schedules a refresh) and through the API.
    browser.filters.state_filter.value = "failed"
    await browser.settle()
    assert [t.definition_name for t in browser.tasks] == ["hist-broken"]
    browser.set_filters(state="waiting", tenant="acme", definition="hist-wait", version=1)
    assert sorted(t.id for t in await browser.refresh()) == sorted(waiting)
    assert browser.filters.version_filter.options == ("(any)", "1")
    assert "hist-wait v1" in browser.listing()

    # Selecting a task in the list opens it.
    browser.task_list.value = waiting[0]
    await browser.settle()
    assert browser.detail is not None and browser.detail.task.id == waiting[0]
    assert browser.detail.wait == "signal 'go'"
    assert browser.signal_name.value == "go"  # filled in from the wait
    # Only the actions the task can take are offered.
    assert not browser.signal_button.disabled and not browser.cancel_button.disabled
    assert browser.reconcile_button.disabled, "the task does not wait for reconciliation"
    text = browser.detail.text()
    assert "waits for:  signal 'go'" in text and "timeline" in text and "claimed" in text
    # The pane shows HTML tables (issue 24): the state as a badge, the timeline's rows.
    pane = browser.detail_pane.value
    assert "<table" in pane and ">waiting</span>" in pane and "<th" in pane, pane
    assert pane.count("<tr") >= len(browser.detail.events) + 3, pane

    # The signal button sends the signal through store.tasks.signal.
    browser.signal_payload.value = '{"by": "test"}'
    browser.signal_button.click()
    await browser.settle()
    signals = await store.tasks.signals(waiting[0])
    assert [(s["name"], s["payload"]) for s in signals] == [("go", {"by": "test"})]
    assert "sent to task" in browser.status
    # Sent, not consumed yet: the task is due, waiting only for a worker (not for the signal).
    detail = await browser.open(waiting[0])
    assert detail.wait == "signal 'go' received; due now, waiting for a worker"
    await run_until_idle(store, DEFINITIONS)
    assert (await store.tasks.get(waiting[0])).state == "succeeded"

    # The cancel button cancels the other waiting task.
    await browser.open(waiting[1])
    browser.cancel_reason.value = "not needed"
    browser.cancel_button.click()
    await browser.settle()
    cancelled = await store.tasks.get(waiting[1])
    assert cancelled.state == "cancelled" and cancelled.error["message"] == "not needed"
    assert browser.detail.task.state == "cancelled"
    assert browser.cancel_button.disabled and browser.signal_button.disabled

    # An action the store refuses shows in the status line, not as a traceback.
    browser.cancel_button.click()
    await browser.settle()
    assert browser.status.startswith("error: task") and "cancelled" in browser.status


@pytest.mark.anyio
async def test_the_browser_reconciles(store: Store) -> None:
    await deploy(store)
    [task_id] = await store.tasks.submit(FLOW, [{"n": 1}], tenant="acme")
    # A non-idempotent intent without outcome: put the task in reconciliation by hand.
    broken = DEFINITIONS[1]
    [uncertain] = await store.tasks.submit(broken, [{}], tenant="globex")
    [claimed] = await store.leases.claim("gone", [broken.digest], limit=1, lease_seconds=30)
    assert claimed.id == uncertain
    async with store.db.connection() as conn:
        await conn.execute(
            "INSERT INTO toolkit_effect_evidence (task_id, tenant, occurrence, step, handler, "
            "idempotent, idempotency_key, record, attempt, fencing_token, worker_id) "
            "VALUES (%s, 'globex', 'only#1', 'only', 'hist.broken', false, 'k', 'started', 1, "
            "%s, 'gone')",
            (uncertain, claimed.token),
        )
        await conn.execute(
            "UPDATE toolkit_tasks SET lease_expires_at = statement_timestamp() - interval '1 s', "
            "checkpoint = checkpoint || jsonb_build_object('pending', 'only#1', "
            "'attempts', jsonb_build_object('only#1', 1)) WHERE id = %s",
            (uncertain,),
        )
    await run_until_idle(store, DEFINITIONS)
    record = await store.tasks.get(uncertain)
    assert (record.state, record.wait_reason) == ("waiting", "reconciliation")

    browser = TaskBrowser(store, operator="alice")
    await browser.refresh()
    detail = await browser.open(uncertain)
    assert detail.reconciliation is not None and "step 'only'" in detail.reconciliation
    # Its path: the step waits, for reconciliation of the intent without outcome.
    assert detail.path is not None and detail.path["only"].status == "waiting"
    assert detail.path["only"].note == (
        "the task waits here (reconciliation); only#1 started at attempt 1"
    )
    assert "data-step='only' data-status='waiting'" in browser.detail_pane.value
    assert browser.reconcile_step.value == "only"
    assert not browser.reconcile_button.disabled
    browser.reconcile_outcome.value = "completed"
    browser.reconcile_result.value = '{"done": true}'
    browser.reconcile_button.click()
    await browser.settle()
    assert "reconciled as completed" in browser.status
    evidence = await store.tasks.evidence(uncertain)
    assert (evidence[-1]["record"], evidence[-1]["worker_id"]) == ("completed", "alice")
    await run_until_idle(store, DEFINITIONS)
    assert (await store.tasks.get(uncertain)).state == "succeeded"
    assert (await store.tasks.get(task_id)).state == "succeeded"


@pytest.mark.anyio
async def test_the_browser_previews_a_redrive_then_applies_what_it_showed(store: Store) -> None:
    await deploy(store)
    await submit_and_run(store, flows=1, broken=2)
    failed = [t.id for t in await store.tasks.list(TaskFilter(state="failed"))]
    done = [t.id for t in await store.tasks.list(TaskFilter(state="succeeded"))]
    assert len(failed) == 2 and len(done) == 1, (failed, done)
    browser = TaskBrowser(store, operator="alice")
    await browser.refresh()
    panel = browser.redrive
    await browser.open(done[0])
    assert panel.preview_button.disabled and panel.apply_button.disabled  # nothing to redrive
    await browser.open(failed[0])
    assert not panel.preview_button.disabled and panel.apply_button.disabled
    panel.preview_button.click()
    await browser.settle()
    assert f"task {failed[0]} (hist-broken v2, failed) resumes at step &#x27;only&#x27;" in (
        panel.preview_pane.value
    ), panel.preview_pane.value
    assert "called again: 1" in panel.preview_pane.value
    assert (await store.tasks.get(failed[0])).state == "failed"  # a preview writes nothing
    panel.reason.value = "fixed the handler"
    panel.apply_button.click()
    await browser.settle()
    assert browser.status == f"task {failed[0]} redriven at step 'only'; queued", browser.status
    assert (await store.tasks.get(failed[0])).state == "queued"
    (event,) = [e for e in await store.tasks.events(failed[0]) if e["kind"] == "redriven"]
    assert event["worker_id"] == "alice" and event["detail"]["reason"] == "fixed the handler"
    assert panel.apply_button.disabled and browser.detail is not None

    # A task that changed after its preview is not redriven by that preview.
    await browser.open(failed[1])
    await panel.preview()
    await store.tasks.redrive(failed[1])
    await run_until_idle(store, DEFINITIONS)  # it fails again: failed, under another token
    panel.apply_button.click()
    await browser.settle()
    assert "changed since its preview" in browser.status, browser.status
    redriven = [e for e in await store.tasks.events(failed[1]) if e["kind"] == "redriven"]
    assert len(redriven) == 1, redriven


# --- the dashboard ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_dashboard_plots_an_export(store: Store, tmp_path: Path) -> None:
    await deploy(store)
    await submit_and_run(store)
    await export_history(store.db, tmp_path)
    with history.open(tmp_path) as h:
        figure = plot_history(h, "10s")
    assert [ax.get_ylabel() for ax in figure.axes] == [
        "queue delay (s)",
        "tasks ended",
        "failed tasks",
    ]
    assert figure.axes[0].lines and figure.axes[2].lines
    # Regression (tutorial 5): the title was the export's folder (a temporary one there), the
    # legend covered the first bar, and the failed-task counts had ticks at 0.5.
    assert figure.get_suptitle() == "task history"
    FigureCanvasAgg(figure).draw()
    for ax in figure.axes:
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1, "beside the panel"
    for ax in figure.axes[1:]:
        assert all(float(tick).is_integer() for tick in ax.get_yticks()), ax.get_yticks()
    with history.open(tmp_path) as h:
        titled = plot_history(h, "10s", title="two waves")
    assert titled.get_suptitle() == "two waves"


@pytest.mark.anyio
async def test_the_browser_filters_by_tag_pages_and_acts_in_bulk(store: Store) -> None:
    await deploy(store)
    acme = await store.tasks.submit(WAITER, [{}] * 7, tags={"customer": "acme"})
    await store.tasks.submit(WAITER, [{}] * 2, tags={"customer": "globex"})
    browser = TaskBrowser(store, limit=3)
    browser.set_filters(tags={"customer": "acme"})
    assert [t.id for t in await browser.refresh()] == acme[::-1][:3]
    assert browser.status == "3 tasks (the newest) of 7" and browser.newer_button.disabled
    assert [t.id for t in await browser.next_page()] == acme[::-1][3:6]
    assert browser.status == "tasks 4 to 6 of 7" and not browser.older_button.disabled
    assert [t.id for t in await browser.next_page()] == acme[:1]
    assert browser.older_button.disabled
    assert [t.id for t in await browser.previous_page()] == acme[::-1][3:6]

    # The text field: a tag that does not parse is one line in the status, not a traceback.
    browser.filters.tags_filter.value = "customer"
    await browser.settle()
    assert browser.status.startswith("error: filter tags: 'customer' is not KEY=VALUE")
    browser.filters.tags_filter.value = "customer=globex"
    await browser.settle()
    assert browser.total == 2

    # The bulk panel acts on the current filter: the preview first, then the plan.
    browser.bulk.action.value = "cancel"
    browser.bulk.preview_button.click()
    await browser.settle()
    plan = browser.bulk.plan
    assert plan is not None and plan.planned == 2 and not browser.bulk.apply_button.disabled
    assert "2 tasks match" in browser.bulk.preview_pane.value
    assert "cancelled at once: 2 queued or waiting tasks" in browser.bulk.preview_pane.value
    browser.bulk.apply_button.click()
    await browser.settle()
    assert browser.status == f"plan {plan.id} applied: 2 acted on"
    assert {t.state for t in browser.tasks} == {"cancelled"}
    assert await store.tasks.count(state="queued") == 7


@pytest.mark.anyio
async def test_the_browser_shows_the_events_that_started_and_reached_a_task(
    store: Store,
) -> None:
    definition = load_definition(EXAMPLES / "order-events.yaml")
    await store.definitions.deploy(definition)
    placed = await store.events.emit("order.placed", {"order_id": "o-1", "total": 3})
    settled = await store.events.emit("payment.settled", {"order_id": "o-1", "amount": 3})
    worker = Worker(store, App("no-handlers"), [definition])  # order-events calls none
    await WorkflowSupervisor(worker, SupervisorConfig(until_idle=True)).run()
    browser = TaskBrowser(store)
    await browser.refresh()
    detail = await browser.open(placed.started[0])
    assert detail.task.state == "succeeded", detail.text()
    assert "events emitted" in detail.text(), detail.text()
    assert [(e["id"], e["how"]) for e in detail.emitted] == [
        (placed.event_id, "started"), (settled.event_id, "delivered"),
    ]  # fmt: skip


@pytest.mark.anyio
async def test_an_open_live_task_updates_without_refresh_until_it_ends(store: Store) -> None:
    """The live view (issue 23): while the open task runs, what it publishes and its state
    show in the detail, its progress on the line below; at its end the view stops."""
    await deploy(store)
    await store.tasks.submit(FLOW, [{"n": 1}])
    (task,) = await store.leases.claim("w1", [FLOW.digest], 1, 30)
    fence = task.fence("w1")
    await store.streams.publish(fence, "first#1", {"token": 0})
    browser = TaskBrowser(store)
    await browser.refresh()
    opened = await browser.open(task.id)
    assert [item.value for item in opened.stream] == [{"token": 0}], opened.text()
    assert browser.live.following == task.id

    async def shows(check: Any) -> None:
        async def holds() -> bool:
            return browser.detail is not None and bool(check(browser.detail))

        await eventually(holds, timeout=15, what=f"the detail to change: {browser.live.line.value}")

    await store.streams.publish(fence, "first#1", {"token": 1})
    await shows(lambda d: [i.seq for i in d.stream] == [1, 2])
    assert "&quot;token&quot;: 1" in browser.detail_pane.value  # the pane shows it
    await store.streams.progress(task.id, {"done": 50})

    async def progressed() -> bool:
        return browser.live.progress == {"done": 50}

    await eventually(progressed, timeout=15, what="the progress line")
    assert "50" in browser.live.line.value
    write = FencedWrite(fence, {"cursor": None}, state="succeeded", result={"ok": True})
    await store.leases.commit(write)
    await shows(lambda d: d.task.state == "succeeded")

    async def stopped() -> bool:
        return browser.live.following is None

    await eventually(stopped, timeout=15, what="the live view to stop at the task's end")
    assert browser.live.line.value == ""
    # An ended task opens without a live view.
    await browser.open(task.id)
    assert browser.live.following is None


@pytest.mark.anyio
async def test_a_live_render_of_the_task_open_before_does_not_replace_the_open_one(
    store: Store,
) -> None:
    """Regression (CI): the live view's render of a task still in flight when the operator
    opened another replaced the open task in the pane and forgot its redrive preview, so
    *Redrive task* said "preview the redrive first"."""
    await deploy(store)
    await submit_and_run(store, flows=0, broken=1)
    (failed,) = [t.id for t in await store.tasks.list(TaskFilter(state="failed"))]
    (live,) = await store.tasks.submit(FLOW, [{"n": 1}])  # queued: followed once opened
    browser = TaskBrowser(store, operator="alice")
    await browser.refresh()
    await browser.open(live)
    assert browser.live.following == live
    await browser.open(failed)
    preview = await browser.redrive.preview()
    # What the live view calls when the task it followed changed, finishing late.
    await browser.live._render(live)
    assert browser.detail is not None and browser.detail.task.id == failed, browser.detail
    assert browser.redrive.plan == preview and not browser.redrive.apply_button.disabled
    await browser.redrive.apply("fixed")
    assert (await store.tasks.get(failed)).state == "queued"
