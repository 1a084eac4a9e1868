"""Tags and the one task filter: what a filter matches, pages, and the indexes it uses.

Filters run against a few thousand tasks in mixed states and are checked against the same
rows filtered in Python; keyset pages return every matching row exactly once. EXPLAIN tests
on 50,000 tasks show that a tag filter and a state + definition filter read an index.
"""

from __future__ import annotations

import datetime
import json
import random
from typing import Any

import pytest

from tests.helpers.inprocess import deploy_submit, drain, sql
from tests.helpers.workflows import definition
from toolkit.checkpoint import Checkpoint
from toolkit.errors import InputError
from toolkit.store import Store
from toolkit.store.filters import TaskFilter
from toolkit.store.queries import query
from toolkit.store.tags import MAX_TAGS

pytestmark = pytest.mark.anyio

TAGGED = """
name: tagged
version: 1
input: {type: object, properties: {customer: {type: string}, n: {type: integer}}}
tags: {customer: "${ input.customer }", size: "${ input.n }", kind: order}
start: mark
steps:
  mark:
    effect: count.tag
    idempotent: true
    args: {tags: {carrier: dhl, kind: parcel}}
    next: child
  child:
    workflow: {name: tagged-child, input: {n: "${ input.n }"}}
"""

CHILD = """
name: tagged-child
version: 1
input: {type: object}
tags: {role: child, size: "${ input.n }"}
start: done
steps:
  done: {succeed: {output: ok}}
"""


async def test_tags_come_from_the_definition_the_submit_a_handler_and_a_parent(
    store: Store,
) -> None:
    await store.definitions.deploy(definition(CHILD))
    (task_id,) = await deploy_submit(
        store, TAGGED, [{"customer": "acme", "n": 7}], tags={"region": "eu", "kind": "rush"}
    )
    task = await store.tasks.get(task_id)
    # The definition's, then the submit's over them (kind); a number becomes its text.
    assert task.tags == {"customer": "acme", "size": "7", "kind": "rush", "region": "eu"}
    await drain(store, TAGGED, CHILD)
    task = await store.tasks.get(task_id)
    assert task.state == "succeeded", task
    # ctx.tag, written with the step's completed evidence.
    assert task.tags == {
        "customer": "acme", "size": "7", "kind": "parcel", "region": "eu", "carrier": "dhl",
    }  # fmt: skip
    (child,) = await store.tasks.list(definition="tagged-child")
    # The parent's tags, when the child started (after mark), then the child's own.
    assert child.tags == {
        "customer": "acme", "kind": "parcel", "region": "eu", "carrier": "dhl",
        "role": "child", "size": "7",
    }  # fmt: skip
    assert [t.id for t in await store.tasks.list(tags={"carrier": "dhl", "role": "child"})] == [
        child.id
    ]


async def test_a_failed_call_keeps_its_tags_and_a_null_tag_is_left_out(store: Store) -> None:
    text = """
name: tag-fail
version: 1
input: {type: object}
tags: {customer: "${ input.customer }"}
start: mark
steps:
  mark:
    effect: count.tag
    idempotent: true
    retry: {max_attempts: 1}
    args: {tags: {tried: "yes"}, fail: true}
"""
    (task_id,) = await deploy_submit(store, text, [{}])
    assert (await store.tasks.get(task_id)).tags == {}  # input.customer is null: no tag
    await drain(store, text)
    task = await store.tasks.get(task_id)
    assert task.state == "failed", task
    assert task.tags == {"tried": "yes"}


@pytest.mark.parametrize(
    ("tags", "fault"),
    [
        ({"bad key": "x"}, "tag key 'bad key' is not one"),
        ({"k": 5}, "tag 'k': the value must be a string"),
        ({"k": "x" * 300}, "the value is 300 characters, at most 256"),
        ({f"k{i}": "v" for i in range(MAX_TAGS + 1)}, "33 tags: a task has at most 32"),
        ({"k": "a\nb"}, "holds a control character"),
    ],
)
async def test_a_bad_tag_is_refused_with_what_is_wrong(
    store: Store, tags: dict[str, Any], fault: str
) -> None:
    with pytest.raises(InputError, match=fault):
        await deploy_submit(store, CHILD, [{}], tags=tags)
    assert await store.tasks.count() == 0


async def test_a_definition_tag_that_gives_an_object_is_refused_at_submit(store: Store) -> None:
    with pytest.raises(InputError, match=r"tag 'size' of tagged-child: .* gives dict") as caught:
        await deploy_submit(store, CHILD, [{"n": {"id": 1}}])
    assert caught.value.path == "$.tags.size"


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"state": "running"}, "state"),
        ({"wait_reason": "nap"}, "wait_reason"),
        ({"definition": "orders@two"}, "definition"),
        ({"created_since": "yesterday"}, "created_since"),
        ({"tags": {"": "x"}}, "tags"),
    ],
)
def test_a_bad_filter_field_is_refused_naming_it(fields: dict[str, Any], path: str) -> None:
    with pytest.raises(InputError) as caught:
        TaskFilter(**fields)
    assert caught.value.path == path, caught.value


# --- filters over a few thousand tasks -----------------------------------------------------

MIXED_STATES = ("queued", "waiting", "succeeded", "failed", "cancelled")
CUSTOMERS = ("acme", "globex", "initech")


async def _mixed(store: Store, count: int, *, seed: int = 7) -> list[dict[str, Any]]:
    """``count`` tasks of two definitions in mixed states, tags, errors and times."""
    rng = random.Random(seed)
    for text in (CHILD, CHILD.replace("tagged-child", "other")):
        await store.definitions.deploy(definition(text))
    d = definition(CHILD)
    checkpoint = json.dumps(Checkpoint.initial(d.start).to_json())
    rows = []
    for i in range(count):
        state = rng.choice(MIXED_STATES)
        rows.append({
            "name": rng.choice(("tagged-child", "other")),
            "state": state,
            "wait_reason": rng.choice(("signal", "timer")) if state == "waiting" else None,
            "tenant": rng.choice(("t1", "t2")),
            "tags": {"customer": rng.choice(CUSTOMERS), **({"vip": "yes"} if i % 7 == 0 else {})},
            "error": {"name": rng.choice(("Declined", "Timeout")), "step": "done"}
            if state == "failed" else None,
            "cursor": None if state in ("succeeded", "failed", "cancelled") else
            rng.choice(("done", "other")),
            "age": rng.randrange(0, 48 * 3600),
        })  # fmt: skip
    await sql(
        store,
        """
        INSERT INTO toolkit_tasks
            (definition_name, definition_version, definition_digest, input, checkpoint, state,
             wait_reason, tenant, tags, error, created_at, finished_at, run_at)
        SELECT r.name, 1, 'digest', '{}', %s::jsonb || jsonb_build_object('cursor', r.cursor),
               r.state, r.wait_reason, r.tenant, r.tags, r.error,
               now() - r.age * interval '1 second',
               CASE WHEN r.state IN ('succeeded', 'failed', 'cancelled')
                    THEN now() - r.age * interval '1 second' + interval '1 minute' END,
               now() + interval '1 hour'
        FROM jsonb_to_recordset(%s::jsonb) AS r(name text, state text, wait_reason text,
             tenant text, tags jsonb, error jsonb, cursor text, age integer)
        """,
        checkpoint,
        json.dumps(rows),
    )
    ids = [row[0] for row in await sql(store, "SELECT id FROM toolkit_tasks ORDER BY id")]
    return [{**row, "id": task_id} for row, task_id in zip(rows, ids, strict=True)]


def _matches(row: dict[str, Any], where: dict[str, Any]) -> bool:
    """The filter computed in Python over the rows as inserted."""
    states = where.get("state")
    if isinstance(states, str):
        states = (states,)
    if states is not None and row["state"] not in states:
        return False
    if "wait_reason" in where and row["wait_reason"] != where["wait_reason"]:
        return False
    if "tenant" in where and row["tenant"] != where["tenant"]:
        return False
    if "definition" in where and row["name"] != where["definition"].split("@")[0]:
        return False
    if any(row["tags"].get(k) != v for k, v in where.get("tags", {}).items()):
        return False
    if "error" in where and (row["error"] or {}).get("name") != where["error"]:
        return False
    if "step" in where and (row["cursor"] or (row["error"] or {}).get("step")) != where["step"]:
        return False
    if "created_since" in where and row["age"] > where["created_since"]:
        return False
    return True


FILTERS: list[dict[str, Any]] = [
    {},
    {"state": "waiting"},
    {"state": ("queued", "failed")},
    {"state": "waiting", "wait_reason": "signal"},
    {"tenant": "t2", "definition": "other"},
    {"definition": "tagged-child@1", "tags": {"customer": "acme"}},
    {"tags": {"customer": "globex", "vip": "yes"}},
    {"error": "Declined"},
    {"step": "done"},
    {"step": "other", "state": "queued"},
    {"created_since": 6 * 3600},
    {"created_since": 24 * 3600, "tags": {"vip": "yes"}, "state": ("succeeded", "cancelled")},
]


@pytest.mark.parametrize("where", FILTERS, ids=lambda w: json.dumps(w, default=str) or "all")
async def test_a_filter_matches_what_python_computes_and_pages_return_each_once(
    store: Store, where: dict[str, Any]
) -> None:
    rows = await _mixed(store, 2_500)
    # A few seconds' margin on the age bound: the rows' ages were counted from an earlier now.
    fields = dict(where)
    if "created_since" in fields:
        fields["created_since"] = f"{fields['created_since'] - 5}s"
    expected = sorted((r["id"] for r in rows if _matches(r, where)), reverse=True)
    assert expected, f"the filter {where} matches nothing: a weak test"
    where_filter = TaskFilter(**fields)
    assert await store.tasks.count(where_filter) == len(expected)
    seen: list[int] = []
    before = None
    while page := await store.tasks.list(where_filter, before=before, limit=97):
        seen += [t.id for t in page]
        before = page[-1].id
    assert seen == expected, f"{len(seen)} paged, {len(expected)} expected for {where}"


async def test_finished_bounds_take_times(store: Store) -> None:
    rows = await _mixed(store, 500)
    now = datetime.datetime.now(datetime.UTC)
    since = now - datetime.timedelta(hours=12)
    expected = [
        r["id"] for r in rows
        if r["state"] in ("succeeded", "failed", "cancelled") and r["age"] - 60 < 12 * 3600 - 5
    ]  # fmt: skip
    found = await store.tasks.count(finished_since=since.isoformat(), finished_until=now)
    assert abs(found - len(expected)) <= 2, (found, len(expected))  # rows at the bound's edge


# --- the indexes ---------------------------------------------------------------------------

BIG = 50_000


async def _big(store: Store) -> None:
    """50,000 ended tasks of two definitions, one in 500 tagged customer=rare, and a few
    hundred live ones of a third definition; then VACUUM (ANALYZE)."""
    await sql(
        store,
        """
        INSERT INTO toolkit_tasks
            (definition_name, definition_version, definition_digest, input, checkpoint, state,
             tags, finished_at)
        SELECT CASE WHEN i %% 2 = 0 THEN 'orders' ELSE 'billing' END, 1, 'd', '{}'::jsonb,
               '{}'::jsonb,
               'succeeded',
               CASE WHEN i %% 500 = 0 THEN '{"customer": "rare"}'::jsonb
                    ELSE jsonb_build_object('customer', 'c' || (i %% 50)) END,
               now()
        FROM generate_series(1, %s) i
        UNION ALL
        SELECT 'refunds', 1, 'd', '{}'::jsonb, '{}'::jsonb, 'failed', '{}'::jsonb, now()
        FROM generate_series(1, 300) i
        """,
        BIG,
    )
    async with store.db.connection() as conn:
        await conn.execute("VACUUM (ANALYZE) toolkit_tasks")


async def _plan_text(store: Store, name: str, params: dict[str, Any]) -> str:
    """``EXPLAIN`` of a named query as the store runs it (unprepared: a custom plan)."""
    async with store.db.connection() as conn:
        cursor = await conn.execute(f"EXPLAIN {query(name)}", params, prepare=False)
        return "\n".join(row[0] for row in await cursor.fetchall())


# one PostgreSQL's plan (a coordinator's EXPLAIN shows the distributed one)
@pytest.mark.one_postgresql
@pytest.mark.parametrize("name", ["list_tasks", "count_tasks"])
async def test_a_tag_filter_reads_the_tags_index(store: Store, name: str) -> None:
    await _big(store)
    now = await store.tasks.database_now()
    params = {**TaskFilter(tags={"customer": "rare"}).params(now), "before": None, "limit": 50}
    plan = await _plan_text(store, name, params)
    assert "toolkit_tasks_tags" in plan, plan
    assert "Seq Scan" not in plan, plan


# one PostgreSQL's plan (a coordinator's EXPLAIN shows the distributed one)
@pytest.mark.one_postgresql
@pytest.mark.parametrize("name", ["list_tasks", "count_tasks"])
async def test_a_state_and_definition_filter_reads_the_definition_index(
    store: Store, name: str
) -> None:
    await _big(store)
    now = await store.tasks.database_now()
    where = TaskFilter(state="failed", definition="refunds@1")
    plan = await _plan_text(store, name, {**where.params(now), "before": None, "limit": 50})
    assert "toolkit_tasks_definition" in plan, plan
    assert "Seq Scan" not in plan, plan


async def test_succeeded_tasks_stay_out_of_the_state_and_definition_indexes(store: Store) -> None:
    """Migration 0025: a success enters neither index (fewer entries per workflow)."""
    async with store.db.connection() as conn:
        rows = await (
            await conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)",
                (["toolkit_tasks_definition", "toolkit_tasks_state"],),
            )
        ).fetchall()
    assert len(rows) == 2, rows
    for name, text in rows:
        assert text.endswith("WHERE (state <> 'succeeded'::text)"), (name, text)
