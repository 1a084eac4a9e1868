"""Downstream limits (docs/limits.md): fleet-wide concurrency slots and token buckets.

Store-level tests drive :class:`toolkit.store.limits.Limits` on claimed tasks; process tests run
four real ``toolkit run`` workers against the same database and check what the handlers
themselves recorded (``tests/apps/limited.py``), never what the store claims about itself.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from tests.apps.limited import CREATE_TABLES, one_step
from tests.apps.limited import app as limited_app
from tests.processes import (
    backdate_leases,
    query,
    submit_tasks,
    task_events,
    task_row,
    toolkit_process,
    wait_for,
)
from tests.workflows import definition
from toolkit import App, ConfigError, MissingLimits
from toolkit.cli import cli
from toolkit.ops.doctor import diagnose
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.leases import ClaimedTask
from toolkit.store.limits import LimitDeferral, LimitGrant, parse_rate
from toolkit.store.writes import NEVER, EvidenceRecord, FencedWrite

LLM = one_step("lim-llm", "lim.llm", "llm")
API = one_step("lim-api", "lim.api", "api")
SOLO = one_step("lim-solo", "lim.solo", "solo")
FREE = one_step("lim-free", "lim.free", "free")
PER_TENANT = one_step("lim-per-tenant", "lim.per_tenant", "per_tenant")
OCCURRENCE = "call#1"

pytestmark = pytest.mark.anyio


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


def test_app_limit_declarations_are_checked() -> None:
    app = App("t")
    spec = app.limit("llm", max_concurrency=4, rate="600/min")
    assert (spec.max_concurrency, spec.rate_per_second, spec.burst) == (4, 10.0, 10.0)
    assert app.limit("slow", rate="5/h").burst == 1.0  # one second's worth, at least 1
    assert app.limit("tenanted", max_concurrency=1, per="tenant").per_tenant
    for kwargs, message in [
        ({}, "give max_concurrency, rate, or both"),
        ({"max_concurrency": 0}, "max_concurrency must be a positive integer"),
        ({"rate": "1/s", "burst": 0.5}, "burst must be a number >= 1"),
        ({"max_concurrency": 1, "burst": 3}, "a burst needs a rate"),
        ({"max_concurrency": 1, "per": "host"}, "per must be 'tenant' or 'global'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            app.limit("x", **kwargs)
    with pytest.raises(ConfigError, match="declared twice"):
        app.limit("llm", max_concurrency=1)


def test_a_steps_limits_are_its_own_and_its_handlers() -> None:
    app = App("t")
    app.add("h.limited", lambda ctx: None, limits=["b", "a"])
    app.add("h.free", lambda ctx: None)
    step = definition(one_step("x", "h.limited", "a")).steps["call"]
    assert app.step_limits(step) == ("a", "b")
    assert app.step_limits(definition(one_step("y", "h.free", "a")).steps["call"]) == ()


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


# --- CLI and doctor -------------------------------------------------------------------------


def invoke(dsn: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env={"TOOLKIT_DSN": dsn}, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


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


# --- four worker processes ------------------------------------------------------------------


@pytest.fixture
def limited(dsn: str, tmp_path: Path) -> Iterator[Path]:
    """The limit tests' tables, and a folder with every one-step definition of the app."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CREATE_TABLES)
    for name, text in {"llm": LLM, "api": API, "solo": SOLO, "free": FREE}.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    yield tmp_path


def start_workers(dsn: str, folder: Path, n: int, *extra: str) -> list[subprocess.Popen[str]]:
    """Start ``n`` workers and wait until every one is registered (claiming)."""
    workers = [
        toolkit_process(
            dsn,
            "run",
            "--app",
            "tests.apps.limited",
            "--definitions",
            str(folder),
            "--worker-id",
            f"lim-{i}",
            *extra,
        )
        for i in range(n)
    ]
    live = "SELECT count(*) FROM toolkit_workers WHERE stopped_at IS NULL"
    wait_for(lambda: query(dsn, live) == [(n,)], timeout=30, what=f"{n} workers")
    return workers


def stop_workers(workers: list[subprocess.Popen[str]]) -> list[str]:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    outputs = []
    for worker in workers:
        out, err = worker.communicate(timeout=30)
        outputs.append(out + err)
    return outputs


def states(dsn: str, ids: list[int]) -> dict[str, int]:
    rows = query(
        dsn, "SELECT state, count(*) FROM toolkit_tasks WHERE id = ANY(%s) GROUP BY 1", (ids,)
    )
    return {str(state): int(n) for state, n in rows}  # type: ignore[call-overload]


def calls(dsn: str, limit: str) -> list[tuple[datetime.datetime, datetime.datetime | None]]:
    return query(
        dsn,
        "SELECT started_at, ended_at FROM test_limit_calls WHERE limit_name = %s "
        "ORDER BY started_at",
        (limit,),
    )  # type: ignore[return-value]


def test_max_concurrency_holds_over_four_workers_and_unlimited_tasks_are_not_slowed(
    dsn: str, limited: Path
) -> None:
    """24 calls of 0.3 s under ``llm`` (max_concurrency 3) and 24 unlimited ones submitted
    right behind them, four workers of concurrency 4: never more than 3 calls inside the
    limit at once, and the unlimited tasks run at once while the limited backlog drains."""
    workers = start_workers(
        dsn, limited, 4, "--concurrency", "4", "--lease", "5", "--heartbeat", "1"
    )
    try:
        limited_ids = submit_tasks(dsn, LLM, [{"seconds": 0.3}] * 24)
        free_ids = submit_tasks(dsn, FREE, [{"seconds": 0.0}] * 24)
        wait_for(
            lambda: states(dsn, free_ids) == {"succeeded": 24},
            timeout=30,
            what="the unlimited tasks",
        )
        free_done = time.monotonic()
        wait_for(
            lambda: states(dsn, limited_ids) == {"succeeded": 24},
            timeout=45,
            what="the limited tasks",
        )
        limited_done = time.monotonic()
    finally:
        outputs = stop_workers(workers)
    assert all("Traceback" not in out for out in outputs), outputs
    peak = query(dsn, "SELECT peak, inside FROM test_limit_inside WHERE limit_name = 'llm'")
    assert peak == [(3, 0)]  # the limit was reached, never exceeded
    intervals = calls(dsn, "llm")
    assert len(intervals) == 24
    at_once = max(
        sum(1 for s, e in intervals if s <= start and e is not None and e > start)
        for start, _ in intervals
    )
    assert at_once <= 3  # the same from the recorded database times
    # Deferred tasks waited without their lease, with reason limit.
    kinds = [e["kind"] for i in limited_ids for e in task_events(dsn, i)]
    assert kinds.count("limit_deferred") > 0
    # The unlimited tasks were not held behind the limited backlog.
    delays = [
        (e["at"] - task_row(dsn, i)["created_at"]).total_seconds()
        for i in free_ids
        for e in task_events(dsn, i)
        if e["kind"] == "claimed"
    ][:24]
    assert statistics.median(delays) < 0.5, delays
    assert limited_done - free_done > 0.5  # they finished while the limited ones went on
    assert query(
        dsn,
        "SELECT count(*) FROM toolkit_limit_slots s JOIN toolkit_tasks t "
        "ON t.id = s.task_id AND t.state = 'leased'",
    ) == [(0,)]


TAKES = """
CREATE TABLE test_token_takes (at timestamptz NOT NULL, tokens float8 NOT NULL);
CREATE FUNCTION test_token_taken() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_token_takes VALUES (clock_timestamp(), NEW.tokens);
    RETURN NEW;
END $$;
CREATE TRIGGER test_token_taken AFTER UPDATE ON toolkit_limit_buckets
    FOR EACH ROW EXECUTE FUNCTION test_token_taken();
"""


def over_bucket(times: list[datetime.datetime], rate: float, burst: float) -> float:
    """The most calls of any window [t_i, t_j] beyond ``burst + rate * (t_j - t_i)``."""
    worst = -burst
    for i, begin in enumerate(times):
        for j in range(i, len(times)):
            window = (times[j] - begin).total_seconds()
            worst = max(worst, (j - i + 1) - (burst + rate * window))
    return worst


def test_a_rate_holds_over_ten_seconds_within_one_token(dsn: str, limited: Path) -> None:
    """220 calls under ``api`` (20/s, burst 20) with four workers: in every window of the
    run, calls <= burst + rate * window + 1, and the run takes the time the bucket says."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TAKES)  # every token taken, at its database time
    workers = start_workers(
        dsn, limited, 4, "--concurrency", "8", "--lease", "5", "--heartbeat", "1"
    )
    try:
        ids = submit_tasks(dsn, API, [{}] * 220)
        wait_for(lambda: states(dsn, ids) == {"succeeded": 220}, timeout=40, what="the tasks")
    finally:
        outputs = stop_workers(workers)
    assert all("Traceback" not in out for out in outputs), outputs
    starts = [s for s, _ in calls(dsn, "api")]
    assert len(starts) == 220
    rate, burst = 20.0, 20.0
    takes = [t for (t,) in query(dsn, "SELECT at FROM test_token_takes ORDER BY at")]
    assert len(takes) == 220  # one token per call, none taken twice
    # Over the whole run this says takes[-1] - takes[0] >= (220 - burst - 1) / rate: the
    # rate really held the run back for about 10 s.
    assert over_bucket(takes, rate, burst) <= 1.0
    # The calls as the handler saw them start: the same, give or take the latency between
    # a token's take and the call (one token per 50 ms of it at 20/s). The first and last
    # starts may differ in that latency, so the run's length is bounded through the takes.
    assert over_bucket(starts, rate, burst) <= 3.0
    run = (starts[-1] - starts[0]).total_seconds()
    assert run < (220 - burst) / rate + 5  # and the tasks were not left waiting much longer


def test_a_sigkilled_workers_slot_frees_at_its_lease_expiry(dsn: str, limited: Path) -> None:
    """A worker holding the only ``solo`` slot is SIGKILLed mid-call: the waiting task shows
    reason limit, and another worker takes the slot once the dead lease expires (2 s)."""
    workers = start_workers(
        dsn, limited, 2, "--concurrency", "2", "--lease", "2", "--heartbeat", "0.5"
    )
    try:
        (hung,) = submit_tasks(dsn, SOLO, [{"hang_first": 60}])
        wait_for(lambda: len(calls(dsn, "solo")) == 1, timeout=20, what="the first call")
        (second,) = submit_tasks(dsn, SOLO, [{"seconds": 0}])
        wait_for(
            lambda: task_row(dsn, second)["wait_reason"] == "limit",
            timeout=10,
            what="the second task to wait for the limit",
        )
        for _ in range(5):  # the task looks again now and then: catch it waiting
            out = invoke(dsn, "show", str(second))[1]
            if "state:      waiting (limit)" in out:
                break
        assert "state:      waiting (limit)" in out
        assert "waits for:  limit 'solo' (deferral " in out
        owner = task_row(dsn, hung)["lease_owner"]
        victim = workers[int(str(owner).rsplit("-", 1)[1])]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        expiry = task_row(dsn, hung)["lease_expires_at"]
        wait_for(lambda: len(calls(dsn, "solo")) == 3, timeout=20, what="the slot to free")
        wait_for(
            lambda: states(dsn, [hung, second]) == {"succeeded": 2}, timeout=20, what="both tasks"
        )
    finally:
        stop_workers(workers)
    later = [s for s, _ in calls(dsn, "solo")][1:]
    assert min(later) >= expiry  # the dead worker's slot held until its lease expired
    assert (min(later) - expiry).total_seconds() < 3.0  # and was taken soon after
    assert query(
        dsn,
        "SELECT count(*) FROM toolkit_limit_slots s JOIN toolkit_tasks t "
        "ON t.id = s.task_id AND t.state = 'leased'",
    ) == [(0,)]


def test_yaml_limits_of_a_step_join_its_handlers_and_must_be_declared() -> None:
    text = one_step("y", "h.limited", "a").replace(
        "idempotent: true", "limits: [c]\n    idempotent: true"
    )
    app = App("t")
    app.add("h.limited", lambda ctx: None, limits=["a"])
    d = definition(text)
    assert app.step_limits(d.steps["call"]) == ("a", "c")
    with pytest.raises(MissingLimits) as refused:
        app.check_limits([d], stored=["a"])
    assert str(refused.value) == (
        "<test>: $.steps.call.limits: limit 'c' is not declared in app 't' (app.limit) nor set "
        "in the store (toolkit limits set)"
    )
    app.check_limits([d], stored=["a", "c"])
