"""Downstream limits (docs/limits.md) in the store: rates, slots and token buckets on claimed
tasks through :class:`toolkit.store.limits.Limits`, and `toolkit limits` (the declarations:
``tests/application/test_app.py``; four worker processes: ``tests/process/test_limits.py``)."""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import anyio
import pytest

from tests.apps.limited import app as limited_app
from tests.helpers.citus import on_citus
from tests.helpers.inprocess import invoke
from tests.helpers.processes import backdate_leases, eventually, lock_waits, query
from tests.helpers.triggers import as_distributed
from tests.helpers.workflows import PER_TENANT, SOLO, definition
from toolkit import App, ConfigError, MissingLimits
from toolkit.ops.doctor import diagnose
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.leases import ClaimedTask
from toolkit.store.limits import LimitDeferral, LimitGrant, parse_rate
from toolkit.store.writes import NEVER, EvidenceRecord, FencedWrite

pytestmark = pytest.mark.anyio

OCCURRENCE = "call#1"
HOUR = datetime.timedelta(hours=1)


# --- declaration ----------------------------------------------------------------------------


def test_rates_parse_to_calls_per_second() -> None:
    assert parse_rate("600/min") == 10.0
    assert parse_rate("20/s") == 20.0
    assert parse_rate("5/h") == pytest.approx(5 / 3600)
    assert parse_rate(2.5) == 2.5
    assert parse_rate("1/h") == pytest.approx(1 / 3600)
    for bad in ("20", "20/day", "-1/s", "0/s", True, 0, "0.00000001/h", 1e-21):
        with pytest.raises(ConfigError):
            parse_rate(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"at least 1/day \(1.16e-05/s\), not '0.01/h'"):
        parse_rate("0.01/h")  # one in 100 hours


# --- the store ------------------------------------------------------------------------------


async def claimed(store: Store, text: str, n: int, tenant: str = "default") -> list[ClaimedTask]:
    d = definition(text)
    await store.definitions.deploy(d)
    ids = await store.tasks.submit(d, [{} for _ in range(n)], tenant=tenant)
    tasks = await store.leases.claim("w", [d.digest], n, 30)
    assert sorted(t.id for t in tasks) == sorted(ids)
    return sorted(tasks, key=lambda t: t.id)


async def acquire(store: Store, task: ClaimedTask, *names: str) -> LimitGrant | LimitDeferral:
    return await store.limits.acquire(task.fence("w"), OCCURRENCE, names or ("solo",))


async def test_sync_stores_app_limits_and_keeps_an_operators(store: Store) -> None:
    assert await store.limits.sync(limited_app.limit_specs) == {"api", "llm", "per_tenant", "solo"}
    api = await store.limits.get("api")
    assert (api.rate_per_second, api.burst, api.max_concurrency, api.source) == (
        20,
        20,
        None,
        "app",
    )
    changed = await store.limits.set("llm", max_concurrency=7)
    assert (changed.max_concurrency, changed.source) == (7, "operator")
    app = App("other")
    app.limit("llm", max_concurrency=2)
    app.limit("api", rate="10/s")
    await store.limits.sync(app.limit_specs)
    assert (await store.limits.get("llm")).max_concurrency == 7  # the operator's value stays
    assert (await store.limits.get("api")).rate_per_second == 10  # the app's follows the app
    more = await store.limits.set("llm", rate="600/min", per="tenant")
    assert (more.max_concurrency, more.rate_per_second, more.burst, more.per_tenant) == (
        7,
        10.0,
        10.0,
        True,
    )
    less = await store.limits.set("llm", max_concurrency=None, rate=None)
    assert (less.max_concurrency, less.rate_per_second, less.burst) == (None, None, None)


async def test_a_full_limit_defers_and_the_outcome_releases_the_slot(store: Store) -> None:
    await store.limits.sync(limited_app.limit_specs)
    first, second, third = await claimed(store, SOLO, 3)
    assert isinstance(await acquire(store, first), LimitGrant)
    assert isinstance(await acquire(store, first), LimitGrant)  # sent again: still held
    deferred = await acquire(store, second)
    assert isinstance(deferred, LimitDeferral)
    assert (deferred.name, deferred.scope, deferred.reason) == ("solo", "", "concurrency")
    assert 0 < deferred.delay_seconds <= 0.25
    assert (await store.limits.get("solo")).in_use == 1
    # The second task waits for the limit; the first one's outcome frees the slot and wakes it.
    wait = {"occurrence": OCCURRENCE, "limit": "solo", "scope": ""}
    await store.leases.commit(
        FencedWrite(
            second.fence("w"),
            {**second.checkpoint, "wait": wait},
            state="waiting",
            wait_reason="limit",
            run_at=NEVER,
        ),
    )
    assert (await store.limits.get("solo")).waiting == 1
    record = EvidenceRecord(OCCURRENCE, "call", "lim.solo", True, "k", "completed", 1, result=1)
    await store.leases.commit(
        FencedWrite(first.fence("w"), first.checkpoint, evidence=(record,))
    )
    assert (await store.limits.get("solo")).in_use == 0
    assert query(
        store.db.dsn,
        "SELECT run_at <= clock_timestamp() FROM toolkit_tasks WHERE id = %s",
        (second.id,),
    ) == [(True,)]
    assert isinstance(await acquire(store, third), LimitGrant)


@pytest.mark.parametrize("layout", ["as migrated", "distributed by tenant"])
async def test_a_released_global_slot_wakes_a_waiter_of_another_tenant(
    store: Store, layout: str, pytestconfig: pytest.Config
) -> None:
    # A store distributed by tenant routes the group commit to the releasing tenant's shard:
    # the waiter of another tenant is woken by a statement of its own, after the commit.
    if layout == "distributed by tenant":
        if on_citus(pytestconfig):
            pytest.skip("the cluster's store is distributed as migrated (--citus)")
        store = await as_distributed(store)
    await store.limits.sync(limited_app.limit_specs)
    (holder,) = await claimed(store, SOLO, 1, tenant="acme")
    (waiter,) = await claimed(store, SOLO, 1, tenant="globex")
    (bystander,) = await claimed(store, SOLO, 1, tenant="initech")
    assert isinstance(await acquire(store, holder), LimitGrant)
    wait = {"occurrence": OCCURRENCE, "limit": "solo", "scope": ""}
    now = datetime.datetime.now(datetime.UTC)
    # the bystander is due later: one slot freed wakes the waiter alone
    for task, run_at in ((waiter, now + HOUR), (bystander, now + 2 * HOUR)):
        assert isinstance(await acquire(store, task), LimitDeferral)
        await store.leases.commit(
            FencedWrite(task.fence("w"), {**task.checkpoint, "wait": wait}, state="waiting",
                        wait_reason="limit", run_at=run_at.isoformat())
        )  # fmt: skip
    record = EvidenceRecord(OCCURRENCE, "call", "lim.solo", True, "k", "completed", 1, result=1)
    await store.leases.commit(FencedWrite(holder.fence("w"), holder.checkpoint, evidence=(record,)))
    due = query(
        store.db.dsn,
        "SELECT id, run_at <= clock_timestamp() FROM toolkit_tasks WHERE id = ANY(%s) ORDER BY id",
        ([waiter.id, bystander.id],),
    )
    assert due == [(waiter.id, True), (bystander.id, False)], due


async def test_an_expired_lease_holds_no_slot(store: Store) -> None:
    await store.limits.sync(limited_app.limit_specs)
    first, second = await claimed(store, SOLO, 2)
    assert isinstance(await acquire(store, first), LimitGrant)
    assert isinstance(await acquire(store, second), LimitDeferral)
    assert backdate_leases(store.db.dsn, [first.id]) == 1
    assert isinstance(await acquire(store, second), LimitGrant)
    assert query(store.db.dsn, "SELECT task_id FROM toolkit_limit_slots") == [(second.id,)]


async def test_a_per_tenant_limit_has_a_slot_per_tenant(store: Store) -> None:
    await store.limits.sync(limited_app.limit_specs)
    a1, a2 = await claimed(store, PER_TENANT, 2, tenant="acme")
    d = definition(PER_TENANT)
    await store.tasks.submit(d, [{}], tenant="globex")
    (b1,) = await store.leases.claim("w", [d.digest], 1, 30)
    assert isinstance(await acquire(store, a1, "per_tenant"), LimitGrant)
    assert isinstance(await acquire(store, b1, "per_tenant"), LimitGrant)
    deferred = await acquire(store, a2, "per_tenant")
    assert isinstance(deferred, LimitDeferral) and deferred.scope == "acme"
    use = await store.limits.get("per_tenant")
    assert use.in_use == 2 and set(use.scopes) == {"acme", "globex"}


async def test_a_rate_defers_until_the_bucket_refills(store: Store) -> None:
    await store.limits.set("paced", rate="2/s", burst=1)
    first, second = await claimed(store, SOLO, 2)
    assert isinstance(await acquire(store, first, "paced"), LimitGrant)
    deferred = await acquire(store, second, "paced")
    assert isinstance(deferred, LimitDeferral) and deferred.reason == "rate"
    assert 0.4 < deferred.delay_seconds <= 0.5
    assert (await store.limits.get("paced")).in_use == 0  # a rate takes no slot


async def test_all_or_nothing_over_several_limits(store: Store) -> None:
    await store.limits.sync(limited_app.limit_specs)
    await store.limits.set("paced", rate="1/h", burst=1)
    first, second = await claimed(store, SOLO, 2)
    assert isinstance(await acquire(store, first, "paced"), LimitGrant)
    assert isinstance(await acquire(store, second, "solo", "paced"), LimitDeferral)
    assert (await store.limits.get("solo")).in_use == 0  # solo had room, yet nothing was taken


async def test_a_worker_refuses_a_limit_declared_nowhere(store: Store) -> None:
    app = App("t")
    app.add("lim.solo", lambda ctx, **args: None, limits=["nowhere"])
    worker = Worker(store, app, [definition(SOLO)], worker_id="w1")
    with pytest.raises(MissingLimits, match=r"handler 'lim\.solo' of app 't': limit 'nowhere'"):
        await worker.register(1, 30)
    await store.limits.set("nowhere", max_concurrency=2)  # an operator's limit will do
    await worker.register(1, 30)


async def test_the_lease_fences_an_acquisition(store: Store) -> None:
    await store.limits.sync(limited_app.limit_specs)
    (task,) = await claimed(store, SOLO, 1)
    from toolkit.errors import LeaseLost

    with pytest.raises(LeaseLost):
        stale = dataclasses.replace(task.fence("w"), token=task.token + 1)
        await store.limits.acquire(stale, OCCURRENCE, ["solo"])
    assert (await store.limits.get("solo")).in_use == 0


@pytest.mark.one_postgresql  # its instrument: one server's lock waits
async def test_a_limit_made_per_tenant_while_an_acquisition_waits_takes_a_tenant_slot(
    store: Store,
) -> None:
    """An acquisition locks its scopes and reads their state in one round trip; when an
    operator makes the limit per tenant in between, the state is of another scope than the
    one locked, and the acquisition locks and reads again: it takes a slot of the scope the
    limit has now, never a grant without a slot."""
    await store.limits.set("shifting", max_concurrency=1)
    first, second = await claimed(store, SOLO, 2)
    assert isinstance(await acquire(store, first, "shifting"), LimitGrant)  # the global slot
    results: list[LimitGrant | LimitDeferral] = []

    async def second_acquires() -> None:
        results.append(await acquire(store, second, "shifting"))

    async with store.db.connection() as conn, anyio.create_task_group() as group:

        async def waits_for_the_scope() -> bool:
            return await lock_waits(conn) == 1

        await conn.execute("BEGIN")
        await conn.execute(
            "SELECT 1 FROM toolkit_limit_buckets WHERE name = 'shifting' AND scope = ''"
            " FOR UPDATE"
        )
        group.start_soon(second_acquires)
        await eventually(waits_for_the_scope, timeout=15, what="the acquisition waiting")
        await conn.execute("UPDATE toolkit_limits SET per_tenant = true WHERE name = 'shifting'")
        await conn.execute("COMMIT")  # the scope's lock goes with the change
    assert [type(r) for r in results] == [LimitGrant], results
    slots = query(store.db.dsn, "SELECT task_id, scope FROM toolkit_limit_slots ORDER BY task_id")
    assert slots == [(first.id, ""), (second.id, "default")]


# --- CLI and doctor -------------------------------------------------------------------------


def test_cli_sets_and_lists_limits(dsn: str) -> None:
    code, out, err = invoke(
        dsn, "limits", "set", "llm", "--max-concurrency", "4", "--rate", "600/min", "--burst", "20"
    )
    assert (code, err) == (0, "")
    assert out == "limit llm: max concurrency 4, rate 10/s, burst 20 (operator)\n"
    code, out, _ = invoke(dsn, "limits", "set", "llm", "--no-max-concurrency", "--per", "tenant")
    assert out == "limit llm: rate 10/s, burst 20, per tenant (operator)\n"
    invoke(dsn, "limits", "set", "db", "--max-concurrency", "2")
    code, out, _ = invoke(dsn, "limits", "list")
    lines = out.splitlines()
    assert lines[0].split() == [
        "LIMIT",
        "MAX",
        "IN",
        "USE",
        "RATE/S",
        "BURST",
        "PER",
        "WAITING",
        "SOURCE",
    ]
    assert lines[1].split() == ["db", "2", "0", "-", "-", "global", "0", "operator"]
    assert lines[2].split() == ["llm", "-", "0", "10", "20", "tenant", "0", "operator"]
    rows = json.loads(invoke(dsn, "limits", "list", "--json")[1])
    assert rows[1]["name"] == "llm" and rows[1]["rate_per_second"] == 10.0
    for args, message in [
        (["--rate", "fast"], "error: rate of limit 'llm' must be like '600/min'"),
        (["--rate", "1/s", "--no-rate"], "error: give --rate or --no-rate, not both"),
        (["--max-concurrency", "99999999999"], "error: max_concurrency of limit 'llm' must be"
         " from 1 to 2147483647, not 99999999999"),
        (["--max-concurrency", "1", "--no-max-concurrency"], "error: give --max-concurrency"),
        (["--no-rate", "--burst", "5"], "error: burst of limit 'llm' needs a rate; removing"),
    ]:
        code, out, err = invoke(dsn, "limits", "set", "llm", *args)
        assert code == 1 and out == "" and err.startswith(message), err
    code, out, err = invoke(dsn, "limits", "set", "db", "--burst", "5")  # db has no rate
    assert code == 1 and err.startswith("error: burst of limit 'db' needs a rate, and the"), err
    assert json.loads(invoke(dsn, "limits", "list", "--json")[1]) == rows  # nothing written
    findings = [f for f in anyio_run(diagnose, dsn) if f.check == "limits"]
    assert [f.message for f in findings] == [
        "limit db: 0/2 slots in use; no task waiting",
        "limit llm: rate 10/s; no task waiting",
    ]


def anyio_run(func: Any, *args: Any) -> Any:
    import anyio

    return anyio.run(func, *args)
