"""Golden-history scenarios of the example definitions in ``definitions/``."""

from __future__ import annotations

import shutil

from tests.helpers.golden import EXAMPLES, Run, scenario
from tests.helpers.inprocess import branch_due
from toolkit.examples import app as examples_app

ITEMS = [{"sku": "A-1", "qty": 2, "price": 9.5}, {"sku": "B-2", "qty": 1, "price": 120.0}]


@scenario(examples_app)
async def example_order_saga(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "order-saga.yaml")
    order = {"order_id": "ORD-2024-00001", "customer": "ann", "ship_to": "NL", "items": ITEMS}
    big = {**order, "order_id": "ORD-2024-00002", "items": [{"sku": "C", "qty": 3, "price": 900}]}
    await run.submit(d, order, big)
    await run.drain()


@scenario(examples_app)
async def example_order_saga_compensated(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "order-saga-compensated.yaml")
    paid = {"order_id": "o-1", "customer": "ann", "items": ITEMS}
    declined = {"order_id": "o-2", "items": [{"sku": "X", "qty": 1, "price": 20000}]}
    await run.submit(d, paid, declined)
    await run.drain()


@scenario(examples_app)
async def example_file_ingest(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "file-ingest.yaml")
    shutil.copy(EXAMPLES / "data" / "weather" / "tromso-2024.csv", "station.csv")
    await run.submit(d, {"path": "station.csv", "report_dir": "reports"})
    await run.drain()


@scenario(examples_app)
async def example_batch_map(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "batch-map.yaml")
    await run.submit(d, {"items": ["a", "bb", "ccc", "dddd", "eeeee"]})
    await run.drain()


@scenario(examples_app)
async def example_research_race(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "research-race.yaml")
    await run.submit(d, {"question": "why is the sky blue?", "slow_seconds": 0.5})
    await run.drain()


@scenario(examples_app)
async def example_parent_order(run: Run) -> None:
    parent, _ = await run.deploy(EXAMPLES / "parent-order.yaml", EXAMPLES / "payment.yaml")
    await run.submit(parent, {"order_id": "o-9", "amount": 12.5})
    await run.drain()


@scenario(examples_app)
async def example_approval_callback(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "approval-callback.yaml")
    approved, rejected = await run.submit(
        d, {"request_id": "r-1", "amount": 10}, {"request_id": "r-2", "amount": 99}
    )
    await run.drain()
    for task_id in (approved, rejected):
        await run.store.tasks.complete(await run.open_callback(task_id), result={"seen": True})
    await run.drain()
    await run.store.tasks.signal(approved, "approved", {"by": "bo"})
    await run.store.tasks.signal(rejected, "rejected", {"why": "too much"})
    await run.drain()


@scenario(examples_app)
async def example_poll_loop(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "poll-loop.yaml")
    (task_id,) = await run.submit(d, {"job_id": "job-2"})
    await run.drain()
    while await run.state(task_id) == "waiting":
        await run.due(task_id)
        await run.drain()


# --- branches that wait (issue 18): the outside world played step by step ------------------


@scenario(examples_app)
async def example_parallel_approvals(run: Run) -> None:
    (d,) = await run.deploy(EXAMPLES / "parallel-approvals.yaml")
    (task_id,) = await run.submit(d, {"request_id": "REQ-7"})
    await run.drain()
    for approver in ("security", "legal", "finance"):
        payload = {"approved": True, "by": f"{approver} lead"}
        await run.store.tasks.signal(task_id, "approval", payload, address=approver)
        await run.drain()


@scenario(examples_app)
async def example_poll_or_deadline(run: Run) -> None:
    # the example's 1 s and 3 s, made long: only row surgery makes a branch due here
    text = (EXAMPLES / "poll-or-deadline.yaml").read_text()
    (d,) = await run.deploy(
        text.replace("duration: 1s", "duration: 1h").replace("duration: 3s", "duration: 2h")
    )
    (task_id,) = await run.submit(d, {"job_id": "job-2"})
    await run.drain()  # the poll waits a second, the deadline three
    await branch_due(run.store, task_id, "poll")
    await run.drain()  # the second check is done: the poll wins, the deadline is cancelled


@scenario(examples_app)
async def example_restore_files(run: Run) -> None:
    text = (EXAMPLES / "restore-files.yaml").read_text()  # its 3 s timeout, made long
    (d,) = await run.deploy(text.replace("timeout: 3s", "timeout: 1h"))
    (task_id,) = await run.submit(d, {"files": ["a.tar", "b.tar", "c.tar"]})
    await run.drain()
    for branch in await run.store.branches.of_task(task_id):
        if branch.name != "1":
            token = branch.waits_for[0].split(":", 1)[1]
            await run.store.tasks.complete(token, result={"file": branch.name, "restored": True})
    await branch_due(run.store, task_id, "1")  # b.tar's callback never comes
    await run.drain()


@scenario(examples_app)
async def example_ci_pipeline(run: Run) -> None:
    pipeline, _ = await run.deploy(EXAMPLES / "ci-pipeline.yaml", EXAMPLES / "ci-tests.yaml")
    (task_id,) = await run.submit(pipeline, {"commit": "abc1234"})
    await run.drain()  # the child runs its matrix; the approval branch waits
    await run.store.tasks.signal(
        task_id, "deploy-approved", {"by": "release manager"}, address="approval"
    )
    await run.drain()
