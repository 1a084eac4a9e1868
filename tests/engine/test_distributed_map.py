"""Distributed map steps (``map: {distributed: true}``), in-process against PostgreSQL: items
listed page by page from an effect or a file become child tasks, batched or one each; the
parent waits without a lease and without being woken by each child; failures up to the
tolerated count, then the step fails and cancels the live children; refused inputs are
per-item failures; a page listed twice starts no child twice; max_concurrency holds."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import anyio
import pytest

from tests.apps.counting import app as counting_app
from tests.helpers.inprocess import FAST, deploy_submit, drain, make_due, sql
from tests.helpers.processes import eventually
from tests.helpers.workflows import definition
from toolkit.runtime.config import CancellationToken, SupervisorConfig
from toolkit.runtime.supervisor import WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

pytestmark = pytest.mark.anyio

ITEM = """
name: item
version: 1
input:
  type: object
  required: [n]
  properties: {n: {type: integer}, fail: {type: boolean, default: false}}
start: route
steps:
  route:
    choice: [{when: "${ input.fail }", next: broken}]
    default: work
  work: {effect: count.work, idempotent: true, args: {value: "${ input.n }"}}
  broken: {fail: {error: ItemBroke, message: "item ${ input.n } broke"}}
"""

BATCH = """
name: batch
version: 1
input: {type: object, required: [items, first_index]}
start: work
steps:
  work: {effect: count.work, idempotent: true, args: {value: "${ input.first_index }"}}
"""


def parent(map_fields: str, source: str | None = None) -> str:
    """A parent whose step ``each`` is a distributed map with ``map_fields`` (YAML flow)."""
    source = source or (
        "{effect: count.pages, args: {total: '${ input.total }', size: 10,"
        " fail_every: '${ input.fail_every }', flaky: '${ input.flaky }'}}"
    )
    return f"""
name: wide
version: 1
input:
  type: object
  properties:
    total: {{type: integer, default: 25}}
    fail_every: {{type: integer, default: 0}}
    flaky: {{type: boolean, default: false}}
    path: {{type: string, default: ""}}
start: each
steps:
  each:
    map: {{distributed: true, items_from: {source}, {map_fields}}}
    next: done
    catch: [{{errors: [MapFailed], next: failed}}]
  done: {{succeed: {{output: "${{ steps.each }}"}}}}
  failed: {{succeed: {{output: "${{ steps.each.error }}"}}}}
"""


async def cli(dsn: str, *args: str) -> tuple[int, str, str]:
    """A toolkit command against the test's database (in a thread: it runs its own loop)."""
    from tests.cli.test_cli import invoke

    return await anyio.to_thread.run_sync(lambda: invoke(*args, dsn=dsn))


async def children(store: Store, parent_id: int) -> list[tuple[Any, ...]]:
    """(map_index, state, occurrence) of a parent's children, in item order."""
    return await sql(
        store,
        "SELECT map_index, state, parent_occurrence FROM toolkit_tasks WHERE parent_id = %s"
        " ORDER BY map_index",
        parent_id,
    )


async def run_map(store: Store, text: str, task_input: dict[str, Any], *children: str) -> int:
    """Deploy and submit; run parent and children to the end (`--until-idle` waits for a map
    counting its children)."""
    for child in children:
        await store.definitions.deploy(definition(child))
    (task_id,) = await deploy_submit(store, text, [task_input])
    await drain(store, text, *children)
    return task_id


async def listed(store: Store, text: str, task_id: int) -> None:
    """Run a worker of ``text`` alone (no child runs) until task ``task_id`` waits for its
    children, then stop it."""

    async def waiting() -> bool:
        task = await store.tasks.get(task_id)
        return (task.state, task.wait_reason) == ("waiting", "map") or task.state == "failed"

    shutdown = CancellationToken()
    worker = Worker(store, counting_app, [definition(text)])
    async with anyio.create_task_group() as group:
        group.start_soon(WorkflowSupervisor(worker, SupervisorConfig(**FAST)).run, shutdown)
        await eventually(waiting, what=f"task {task_id} to wait for its map's children")
        shutdown.cancel()


async def test_items_listed_in_pages_run_as_child_tasks_and_the_output_sums_them_up(
    store: Store,
) -> None:
    text = parent("workflow: {name: item}")
    task_id = await run_map(store, text, {"total": 25}, ITEM)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task.error, await children(store, task_id))
    assert task.result == {"items": 25, "tasks": 25, "succeeded": 25, "failed": 0, "errors": []}
    rows = await children(store, task_id)
    assert rows == [(i, "succeeded", f"each#1/{i}") for i in range(25)]
    results = await store.map_items.results(task_id)
    assert [(r.index, r.input, r.result["value"]) for r in results] == [
        (i, {"n": i, "fail": False}, i) for i in range(25)
    ]
    page = await store.map_items.results(task_id, after=20, limit=3)
    assert [r.index for r in page] == [20, 21, 22] and page[0].occurrence == "each#1"
    pages = await sql(
        store, "SELECT occurrence, record FROM toolkit_effect_evidence WHERE task_id = %s"
        " ORDER BY id", task_id,
    )  # fmt: skip
    assert pages == [
        ("each#1/page/each#1", "completed"), ("each#1/page/each#2", "completed"),
        ("each#1/page/each#3", "completed"),
    ]  # fmt: skip


async def test_the_parent_waits_without_a_lease_and_no_child_wakes_it(
    store: Store, dsn: str
) -> None:
    """20,000 children must not wake (and lock) their parent 20,000 times: it counts them."""
    text = parent("workflow: {name: item}")
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"total": 12}])
    await listed(store, text, task_id)
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason, task.lease_owner) == ("waiting", "map", None)
    assert len(await children(store, task_id)) == 12
    code, out, err = await cli(dsn, "show", str(task_id))
    assert code == 0, err
    assert "the 12 child tasks of each#1 (12 items; toolkit tasks --parent lists them)" in out
    assert "map:        each#1: 12 items (all listed) in 12 child tasks, 12 live, 0 items" in out
    code, out, err = await cli(dsn, "tasks", "--parent", str(task_id), "--state", "queued")
    assert code == 0 and out.count(" item ") == 12, (out, err)
    before = await sql(store, "SELECT run_at FROM toolkit_tasks WHERE id = %s", task_id)
    await drain(store, ITEM)  # the children end
    after = await sql(store, "SELECT run_at, child_wake FROM toolkit_tasks WHERE id = %s",
                      task_id)  # fmt: skip
    assert after == [(before[0][0], False)]
    await drain(store, text)  # waits for the parent's next count: it is work in progress
    assert (await store.tasks.get(task_id)).result["succeeded"] == 12


async def test_show_shortens_a_long_list_of_page_calls(store: Store, dsn: str) -> None:
    text = parent("workflow: {name: item}").replace("size: 10,", "size: 1,")
    task_id = await run_map(store, text, {"total": 10}, ITEM)
    code, out, err = await cli(dsn, "show", str(task_id))
    assert code == 0, err
    shown = [line for line in out.splitlines() if "each#1/page/each#" in line]
    assert [line.split()[1] for line in shown] == [
        f"each#1/page/each#{n}" for n in (1, 2, 3, 8, 9, 10)
    ], out
    assert "... 4 more page calls (toolkit show --json lists them)" in out


async def test_items_per_task_batches_items_within_a_page(store: Store) -> None:
    text = parent("workflow: {name: batch}, items_per_task: 4")
    task_id = await run_map(store, text, {"total": 25}, BATCH)
    task = await store.tasks.get(task_id)
    assert task.result == {"items": 25, "tasks": 8, "succeeded": 25, "failed": 0, "errors": []}
    results = await store.map_items.results(task_id)
    # pages of 10: a batch never spans two pages
    assert [r.index for r in results] == [0, 4, 8, 10, 14, 18, 20, 24]
    assert results[2].input == {"items": [{"n": 8}, {"n": 9}], "first_index": 8}


async def test_input_shapes_each_childs_input_from_its_item_and_the_parents_input(
    store: Store,
) -> None:
    text = parent("workflow: {name: batch}, items_per_task: 10, input: {items: "
                  "'${ context.items }', first_index: '${ context.index }', total: "
                  "'${ input.total }'}")  # fmt: skip
    task_id = await run_map(store, text, {"total": 12}, BATCH)
    results = await store.map_items.results(task_id)
    assert [r.input["first_index"] for r in results] == [0, 10]
    assert results[1].input == {"items": [{"n": 10}, {"n": 11}], "first_index": 10, "total": 12}
    text = parent("workflow: {name: item}, input: {n: '${ context.item.n }', fail: "
                  "'${ context.index == `3` }'}, tolerated_failures: 1").replace("wide", "narrow")
    task_id = await run_map(store, text, {"total": 5}, ITEM)
    task = await store.tasks.get(task_id)
    assert (task.result["failed"], task.result["errors"][0]["index"]) == (1, 3), task.result


async def test_failures_up_to_the_tolerated_count_let_the_step_succeed(store: Store) -> None:
    text = parent("workflow: {name: item}, tolerated_failures: 3")
    task_id = await run_map(store, text, {"total": 25, "fail_every": 10}, ITEM)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task.error
    assert (task.result["succeeded"], task.result["failed"]) == (22, 3)
    assert [(e["index"], e["error"]["name"]) for e in task.result["errors"]] == [
        (0, "ItemBroke"), (10, "ItemBroke"), (20, "ItemBroke"),
    ]  # fmt: skip
    failed = await store.map_items.results(task_id, state="failed")
    assert [r.index for r in failed] == [0, 10, 20]


async def test_one_failure_more_fails_the_step_and_cancels_the_live_children(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also a regression (the cluster): the engine cancelled the live children without
    naming their tenant. On Citus the descendants' recursive statement then had no filter
    on the distribution column and was refused: the map's task failed StoreRefused."""
    tenants: list[str | None] = []
    fetch_all = store.db.fetch_all

    async def recording(name: str, params: Any = None, **options: Any) -> Any:
        if name == "live_children":
            tenants.append(params["tenant"])
        return await fetch_all(name, params, **options)

    monkeypatch.setattr(store.db, "fetch_all", recording)
    text = parent("workflow: {name: item}, tolerated_failure_percentage: 10")  # 2 of 25
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"total": 25}])
    await listed(store, text, task_id)  # no child has run
    ids = [row[0] for row in await sql(
        store, "SELECT id FROM toolkit_tasks WHERE parent_id = %s ORDER BY map_index LIMIT 3",
        task_id)]  # fmt: skip
    for child_id in ids:
        await store.tasks.cancel(child_id, "an operator stopped it")
    await make_due(store, task_id)  # its next count: now (its live children run nowhere)
    await drain(store, text)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded" and task.result["name"] == "MapFailed", task.result
    assert (task.result["failed"], task.result["items"]) == (3, 25)
    assert "more than the 2 tolerated; 22 live tasks cancelled" in task.result["message"]
    assert tenants and set(tenants) == {"default"}, tenants  # the operator's and the map's
    states = {row[1] for row in await children(store, task_id)}
    assert states == {"cancelled"}


async def test_an_item_its_workflow_refuses_is_a_failed_item_with_the_reason(
    store: Store, tmp_path: pathlib.Path
) -> None:
    path_text = parent("workflow: {name: item}, tolerated_failures: 1",
                       source="{file: '${ input.path }', page_size: 2}")  # fmt: skip
    await store.definitions.deploy(definition(ITEM))
    lines = ['{"n": 1}', "", '{"n": "two"}', '{"n": 3}']
    file = tmp_path / "items.jsonl"
    file.write_text("\n".join(lines) + "\n")
    task_id = await run_map(store, path_text, {"path": str(file)}, ITEM)
    task = await store.tasks.get(task_id)
    assert task.result["items"] == 3 and task.result["failed"] == 1, task.result
    (error,) = task.result["errors"]
    assert error["index"] == 1 and error["error"]["name"] == "InputError"
    assert "two" in error["error"]["message"] or "integer" in error["error"]["message"]
    rows = await children(store, task_id)
    assert [row[:2] for row in rows] == [(0, "succeeded"), (1, "failed"), (2, "succeeded")]


async def test_a_line_that_is_not_json_fails_the_step_naming_the_file_and_line(
    store: Store, tmp_path: pathlib.Path
) -> None:
    text = parent("workflow: {name: item}", source="{file: '${ input.path }'}")
    file = tmp_path / "items.jsonl"
    file.write_text('{"n": 1}\n{"n": 2,\n')
    task_id = await run_map(store, text, {"path": str(file)}, ITEM)
    task = await store.tasks.get(task_id)
    assert task.state == "failed"
    assert task.error["name"] == "ItemSourceInvalid"
    assert task.error["message"].startswith(f"{file}:2: not a JSON value")
    missing = await run_map(store, text, {"path": str(tmp_path / "none.jsonl")})
    assert (await store.tasks.get(missing)).error["name"] == "FileNotFoundError"


async def test_a_page_listed_again_after_a_crash_starts_no_child_twice(store: Store) -> None:
    text = parent("workflow: {name: item}")
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"total": 25, "flaky": True}])
    await listed(store, text, task_id)  # every page failed once, then was listed
    assert len(await children(store, task_id)) == 25
    # Row surgery: the task is back where it was before its listing was written.
    await sql(
        store,
        "UPDATE toolkit_tasks SET state = 'queued', wait_reason = NULL,"
        " run_at = statement_timestamp(), checkpoint = checkpoint - 'wait' WHERE id = %s",
        task_id,
    )
    await listed(store, text, task_id)
    rows = await children(store, task_id)
    assert [row[0] for row in rows] == list(range(25)), rows
    calls = await sql(store, "SELECT sum(calls) FROM test_calls WHERE step = 'each'")
    assert calls == [(12,)]  # 3 pages, each failed once then listed, all of it twice


async def test_max_concurrency_bounds_the_live_children(keying: Store) -> None:
    """Held as a concurrency key of the children, decided by the statement that inserts
    them (with the key triggers kept and dropped, tests/helpers/triggers.py)."""
    store = keying
    text = parent("workflow: {name: item}, max_concurrency: 4")
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"total": 25}])
    await listed(store, text, task_id)
    held = await sql(
        store, "SELECT count(*) FILTER (WHERE key_held), count(*) FILTER (WHERE wait_reason ="
        " 'concurrency') FROM toolkit_tasks WHERE parent_id = %s", task_id,
    )  # fmt: skip
    assert held == [(4, 21)]
    await drain(store, text, ITEM)
    assert (await store.tasks.get(task_id)).result["succeeded"] == 25


ONCE_BROKEN = """
name: item
version: 1
input: {type: object, properties: {n: {type: integer}, fail: {type: boolean, default: false}}}
start: call
steps:
  call:
    effect: count.first_call_fails
    idempotent: true
    args: {fail: "${ input.fail }"}
    retry: {max_attempts: 1}
"""


async def test_redriving_a_failed_map_runs_its_failed_items_again(store: Store) -> None:
    text = parent("workflow: {name: item}").replace("[MapFailed]", "[NeverRaised]")
    await store.definitions.deploy(definition(ONCE_BROKEN))
    (task_id,) = await deploy_submit(store, text, [{"total": 25, "fail_every": 10}])
    await listed(store, text, task_id)
    await drain(store, ONCE_BROKEN)  # every item ends before the map counts: none cancelled
    await drain(store, text)
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "MapFailed", task.error
    plan = await store.tasks.redrive(task_id)
    lines = "\n".join(plan.lines())
    assert lines.count("is redriven:") == 3, lines  # items 0, 10, 20; the others keep theirs
    await drain(store, text, ONCE_BROKEN)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", (task.error, await children(store, task_id))
    assert (task.result["succeeded"], task.result["failed"]) == (25, 0)
    calls = await sql(store, "SELECT sum(calls) FROM test_calls WHERE step = 'call'")
    assert calls == [(28,)]  # 25 items once, the 3 failed ones again


async def test_cancelling_a_parent_while_it_lists_cancels_the_children_started_after(
    store: Store,
) -> None:
    """A cancel request reaches a listing parent at its next heartbeat: the children started
    by then are cancelled with it, none is left to run (found by a helper's report)."""
    text = parent("workflow: {name: item}").replace("size: 10,", "size: 10, seconds: 0.3,")
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"total": 400}])

    async def some_children() -> bool:
        return len(await children(store, task_id)) >= 10

    async def cancelled() -> bool:
        return (await store.tasks.get(task_id)).state == "cancelled"

    shutdown = CancellationToken()
    worker = Worker(store, counting_app, [definition(text)])
    async with anyio.create_task_group() as group:
        group.start_soon(WorkflowSupervisor(worker, SupervisorConfig(**FAST)).run, shutdown)
        await eventually(some_children, what="the first page's children")
        assert await store.tasks.cancel(task_id) == "requested"
        await eventually(cancelled, what=f"task {task_id} cancelled")
        shutdown.cancel()
    rows = await children(store, task_id)
    assert {row[1] for row in rows} == {"cancelled"}, rows
    assert len(rows) < 400


async def test_cancelling_a_parent_cancels_thousands_of_children_a_batch_at_a_time(
    store: Store,
) -> None:
    """Across CANCEL_BATCH boundaries every child ends cancelled, with its parent's reason
    (one statement per 1,000 children: 0.15 s for 2,500 here, where one per child took
    3.8 s)."""
    text = parent("workflow: {name: item}").replace("size: 10,", "size: 1000,")
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"total": 2500}])
    await drain(store, text)  # lists every item; this worker does not run the children
    assert (await store.tasks.get(task_id)).wait_reason == "map"
    assert await store.tasks.cancel(task_id) == "cancelled"
    rows = await children(store, task_id)
    assert len(rows) == 2500 and {row[1] for row in rows} == {"cancelled"}, rows[:3]
    reasons = await sql(
        store,
        "SELECT DISTINCT e.detail ->> 'reason', count(*) FROM toolkit_task_events e"
        " JOIN toolkit_tasks t ON t.id = e.task_id AND t.tenant = e.tenant"  # (a co-located join)
        " WHERE t.parent_id = %s AND e.kind = 'cancelled' GROUP BY 1",
        task_id,
    )
    assert reasons == [(f"parent task {task_id} cancelled", 2500)], reasons


async def test_a_listing_that_fails_cancels_the_children_it_started(
    store: Store, tmp_path: pathlib.Path
) -> None:
    text = parent("workflow: {name: item}", source="{file: '${ input.path }', page_size: 2}")
    file = tmp_path / "items.jsonl"
    file.write_text('{"n": 1}\n{"n": 2}\n{"n": 3}\n{"n": 4}\n{"n": NaN}\n')
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"path": str(file)}])
    await drain(store, text)  # no child runs: the listing fails at its third page
    task = await store.tasks.get(task_id)
    assert task.state == "failed" and task.error["name"] == "ItemSourceInvalid", task.error
    assert "items.jsonl:5: not a JSON value: NaN is not JSON" in task.error["message"]
    assert [row[1] for row in await children(store, task_id)] == ["cancelled"] * 4


async def test_more_failures_than_tolerated_fail_the_map_while_it_lists(
    store: Store, tmp_path: pathlib.Path
) -> None:
    """A broken map stops at the page where its failures pass the count it tolerates: it
    does not list (and start) every other item first."""
    text = parent("workflow: {name: item}, tolerated_failures: 0",
                  source="{file: '${ input.path }', page_size: 2}")  # fmt: skip
    file = tmp_path / "items.jsonl"
    file.write_text('{"n": "refused"}\n' + '{"n": 1}\n' * 9)
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"path": str(file)}])
    await drain(store, text)
    task = await store.tasks.get(task_id)
    assert task.result["name"] == "MapFailed", task.result
    assert task.result["message"].startswith("1 items failed while listing (after 2)")
    rows = await children(store, task_id)
    assert [row[1] for row in rows] == ["failed", "cancelled"], rows


async def test_an_item_too_large_to_keep_is_a_failed_item_without_its_input(
    store: Store, tmp_path: pathlib.Path
) -> None:
    text = parent("workflow: {name: item}, tolerated_failures: 1",
                  source="{file: '${ input.path }'}")  # fmt: skip
    file = tmp_path / "items.jsonl"
    file.write_text('{"n": 1, "pad": "' + "x" * 1_200_000 + '"}\n{"n": 2}\n')
    task_id = await run_map(store, text, {"path": str(file)}, ITEM)
    task = await store.tasks.get(task_id)
    assert (task.result["succeeded"], task.result["failed"]) == (1, 1), task.result
    (refused,) = await store.map_items.results(task_id, state="failed")
    assert refused.input is None and refused.error["name"] == "PayloadRefused"


async def test_the_childrens_version_is_pinned_at_the_first_page(store: Store) -> None:
    """A takeover lists the rest with the version the first page pinned, not a newer one
    deployed since (found by a helper's report)."""
    text = parent("workflow: {name: item}")
    await store.definitions.deploy(definition(ITEM))
    (task_id,) = await deploy_submit(store, text, [{"total": 25}])
    await listed(store, text, task_id)
    await store.definitions.deploy(definition(ITEM.replace("version: 1", "version: 2")))
    # Row surgery: the task is back where it was after its second page, the third page's
    # children not started (their events first: a distributed store has no foreign keys
    # to delete them with their tasks).
    await sql(
        store,
        "DELETE FROM toolkit_task_events e USING toolkit_tasks t WHERE t.id = e.task_id"
        " AND t.tenant = e.tenant AND t.parent_id = %s AND t.map_index >= 20",
        task_id,
    )
    await sql(store, "DELETE FROM toolkit_tasks WHERE parent_id = %s AND map_index >= 20",
              task_id)  # fmt: skip
    await sql(
        store,
        "UPDATE toolkit_tasks SET state = 'queued', wait_reason = NULL,"
        " checkpoint = jsonb_set(checkpoint, '{wait,map}',"
        " checkpoint #> '{wait,map}' || '{\"cursor\": 20, \"listed\": 20, \"tasks\": 20,"
        " \"listing\": true, \"pages\": 2}') WHERE id = %s",
        task_id,
    )
    await make_due(store, task_id)
    await listed(store, text, task_id)
    versions = await sql(
        store, "SELECT DISTINCT definition_version FROM toolkit_tasks WHERE parent_id = %s",
        task_id,
    )  # fmt: skip
    assert versions == [(1,)]
    assert len(await children(store, task_id)) == 25


SIGNALLED = """
name: item
version: 1
start: approval
steps:
  approval: {wait: {signal: go}}
"""


async def test_until_idle_ends_while_the_children_wait_for_a_signal(store: Store) -> None:
    """`--until-idle` does not wait for a map whose children wait for something outside it,
    and waits for one whose children all ended (its next count ends it)."""
    text = parent("workflow: {name: item}")
    task_id = await run_map(store, text, {"total": 3}, SIGNALLED)  # returns: nothing to do
    task = await store.tasks.get(task_id)
    assert (task.state, task.wait_reason) == ("waiting", "map")
    for row in await sql(store, "SELECT id FROM toolkit_tasks WHERE parent_id = %s", task_id):
        await store.tasks.signal(row[0], "go", {})
    await drain(store, text, SIGNALLED)  # the children end; the map's next count, waited for
    assert (await store.tasks.get(task_id)).result["succeeded"] == 3


def test_the_definition_checks_say_which_fields_go_with_distributed() -> None:
    from tests.helpers.workflows import faults_of

    def messages(map_body: str, nested: bool = False) -> list[str]:
        step = f"map: {map_body}"
        if nested:
            step = (
                "parallel: {branches: {a: {start: m, steps: {m: {" + step + "}}}}}"
            )
        text = f"name: x\nversion: 1\nstart: m\nsteps:\n  m: {{{step}}}\n"
        return [fault.message for fault in faults_of(text)]

    both = messages("{distributed: true, items_from: {effect: a.b, file: x}, workflow: {name: w}}")
    assert any("exactly one of effect (a page source) and file: both are given" in m
               for m in both), both  # fmt: skip
    inline = messages("{distributed: true, items_from: {file: x}, workflow: {name: w},"
                      " items: '${ input }'}")  # fmt: skip
    assert any("items is not used by a distributed map" in m for m in inline), inline
    missing = messages("{distributed: true, items_from: {file: x}}")
    assert any("workflow" in m for m in missing), missing
    plain = messages("{items: '${ input }', tolerated_failures: 1, branch: {start: s,"
                     " steps: {s: {succeed: {}}}}}")  # fmt: skip
    assert any("tolerated_failures belongs to a distributed map" in m for m in plain), plain
    nested = messages("{distributed: true, items_from: {file: x}, workflow: {name: w}}", True)
    assert any("top level only" in m for m in nested), nested


def test_a_page_is_an_object_with_items_and_a_cursor_that_moves_on() -> None:
    from toolkit.engine.steps.distributed_map import ItemSourceInvalid, _effect_page

    assert _effect_page("h", {"items": [1], "cursor": None}, None).items == [1]
    assert _effect_page("h", {"items": [], "cursor": 3}, 2).cursor == 3  # a filtered page
    assert _effect_page("h", {"items": [1], "cursor": ""}, 2).cursor is None  # "" ends it
    for bad, message in (
        ([1, 2], "returned list; a page is an object"),
        ({"items": "x"}, "returned a page with items str"),
        ({"cursor": 1}, "returned a page with no items"),
        ({"items": [1], "cursor": 2}, "returned the cursor it was given (2)"),
    ):
        with pytest.raises(ItemSourceInvalid, match=re.escape(message)):
            _effect_page("h", bad, 2)
