"""Tenant admission against a real PostgreSQL: fair claims, weights, pause, max_active under
concurrent claimers, the settings API and CLI (docs/tenants.md; the hot-tenant run with
worker processes: ``tests/process/test_hot_tenant.py``)."""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import anyio
import psycopg
import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

from tests.conftest import at_schema_version
from tests.helpers.inprocess import expire_leases
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.checkpoint import Checkpoint
from toolkit.cli import cli
from toolkit.definition import WorkflowDefinition
from toolkit.errors import ConfigError, UnknownTenant
from toolkit.store import Store
from toolkit.store.leases import ClaimedTask
from toolkit.store.writes import FencedWrite

pytestmark = pytest.mark.anyio

LEASE = 30.0


async def _deployed(store: Store) -> WorkflowDefinition:
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    return d


async def _finish(store: Store, worker: str, tasks: list[ClaimedTask]) -> None:
    """Release the leases the way a worker does: a fenced write to a terminal state."""
    for task in tasks:
        write = FencedWrite(task.fence(worker), {"cursor": None}, state="succeeded", result={})
        assert await store.leases.commit(write) == "succeeded"


def _checkpoint(d: WorkflowDefinition) -> dict[str, object]:
    """A new task's checkpoint (as a submit writes it)."""
    return Checkpoint.initial(d.start, d.budget).to_json()


async def _active(store: Store, tenant: str) -> int:
    """The tenant's leased tasks whose lease has not expired (what max_active bounds)."""
    return (await store.tenants.get(tenant)).active


# --- registration and the migration ---------------------------------------------------------


async def test_every_submit_registers_its_tenant_with_the_defaults(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": 1}, {"n": 2}], tenant="acme")
    await store.tasks.submit_keyed(d, {"n": 3}, key="k", tenant="globex")
    await store.tasks.submit_keyed(d, {"n": 3}, key="k", tenant="globex")  # the same task
    acme, globex = await store.tenants.list()
    assert (acme.tenant, acme.weight, acme.max_active, acme.paused) == ("acme", 1, None, False)
    assert (acme.queued, acme.leased, acme.waiting, acme.budgets) == (2, 0, 0, {})
    assert (globex.tenant, globex.queued) == ("globex", 1)


async def test_the_migration_registers_the_tenants_of_existing_tasks(empty_dsn: str) -> None:
    at_schema_version(empty_dsn, 1)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint)"
            " SELECT t, 'x', 1, 'd', '{}', '{}' FROM unnest(ARRAY['a', 'b', 'a']) t"
        )
    async with await Store.open(empty_dsn) as store:  # migrates
        assert [t.tenant for t in await store.tenants.list()] == ["a", "b"]
        assert (await store.tenants.get("a")).queued == 2


# --- fairness -------------------------------------------------------------------------------


async def test_claims_interleave_a_big_backlog_with_a_small_tenant(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": i} for i in range(200)], tenant="big")
    await store.tasks.submit(d, [{"n": i} for i in range(12)], tenant="small")
    # Leases held: each batch goes half and half while both have due tasks.
    for _ in range(3):
        batch = await store.leases.claim("w", [d.digest], 8, LEASE)
        assert Counter(t.tenant for t in batch) == {"big": 4, "small": 4}
    # small is drained: big gets whole batches.
    assert Counter(t.tenant for t in await store.leases.claim("w", [d.digest], 8, LEASE)) == {
        "big": 8
    }


# one server's claim counts the leases each tenant holds; a distributed one shares by
# weight and vtime alone (docs/scaling.md)
@pytest.mark.one_postgresql
async def test_a_newcomer_goes_first_while_a_busy_tenant_holds_leases(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": i} for i in range(100)], tenant="busy")
    held = await store.leases.claim("w", [d.digest], 40, LEASE)
    assert {t.tenant for t in held} == {"busy"}
    await store.tasks.submit(d, [{"n": i} for i in range(5)], tenant="new")
    # busy holds 40 leases, new none: new's tasks come first, busy fills the rest.
    batch = await store.leases.claim("w", [d.digest], 8, LEASE)
    assert Counter(t.tenant for t in batch) == {"new": 5, "busy": 3}
    assert [t.id for t in batch] == sorted(t.id for t in batch)  # id order, as before


async def test_every_cold_tenant_starts_before_the_hot_one_runs_a_thousand_more(
    store: Store,
) -> None:
    """Issue 20's fairness bound: a hot tenant with 20,000 due tasks and 500 tenants with 10
    each, equal weights, a worker at concurrency 32 (it finishes the oldest of its leases
    as it claims the next batch of 16): every cold tenant's first task is claimed before
    the hot tenant has run 2 x 500 more tasks, though its backlog is an hour older. Measured:
    17 (each batch gives the hot tenant its share of the leased slots; the 500 cold tenants,
    holding none, fill the rest)."""
    d = await _deployed(store)
    async with store.db.connection() as conn:  # the rows at once, as submits would write them
        await conn.execute(
            "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
            " definition_digest, input, checkpoint, created_at, run_at)"
            " SELECT tenant, %s, %s, %s, '{}', %s, at, at FROM ("
            "   SELECT 'hot' AS tenant, clock_timestamp() - interval '1 hour' AS at"
            "   FROM generate_series(1, 20000)"
            "   UNION ALL SELECT format('cold-%%s', n), clock_timestamp()"
            "   FROM generate_series(1, 500) n, generate_series(1, 10)) rows",
            (d.name, d.version, d.digest, Jsonb(_checkpoint(d))),
        )
        await conn.execute("INSERT INTO toolkit_tenants (tenant) SELECT DISTINCT tenant"
                           " FROM toolkit_tasks ON CONFLICT DO NOTHING")  # fmt: skip
        await conn.execute("ANALYZE toolkit_tasks")
    held: list[ClaimedTask] = []
    hot_run = 0
    cold_started: set[str] = set()
    while len(cold_started) < 500:
        batch = await store.leases.claim("w", [d.digest], 16, LEASE)
        assert batch, f"nothing claimed with {500 - len(cold_started)} cold tenants not started"
        held += batch
        hot_run += sum(1 for t in batch if t.tenant == "hot")
        cold_started |= {t.tenant for t in batch if t.tenant != "hot"}
        finished, held = held[:-16], held[-16:]  # the newest 16 still run, the rest ended
        await _finish(store, "w", finished)
    assert hot_run <= 2 * 500, hot_run


# one server's claim counts the leases each tenant holds; a distributed one shares by
# weight and vtime alone (docs/scaling.md)
@pytest.mark.one_postgresql
async def test_weights_share_the_leased_slots(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": i} for i in range(100)], tenant="heavy")
    await store.tasks.submit(d, [{"n": i} for i in range(100)], tenant="light")
    await store.tenants.set("heavy", weight=3)
    claimed: Counter[str] = Counter()
    for _ in range(5):  # leases held: the shares are of the leased slots
        batch = await store.leases.claim("w", [d.digest], 8, LEASE)
        assert Counter(t.tenant for t in batch) == {"heavy": 6, "light": 2}
        claimed.update(t.tenant for t in batch)
    assert claimed == {"heavy": 30, "light": 10}
    # Released after every claim, each batch splits 3 : 1 too.
    await store.tenants.set("light", weight=3)
    await store.tenants.set("heavy", weight=1)
    for _ in range(3):
        batch = await store.leases.claim("w", [d.digest], 8, LEASE)
        await _finish(store, "w", batch)
        # light now holds a third of heavy's 30 leases: it catches up first.
        claimed.update(t.tenant for t in batch)
    assert claimed == {"heavy": 30, "light": 34}


async def test_a_paused_tenant_is_never_claimed_from_until_resumed(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": i} for i in range(3)], tenant="held")
    await store.tasks.submit(d, [{"n": i} for i in range(3)], tenant="free")
    record = await store.tenants.set("held", paused=True)
    assert record.paused and record.queued == 3
    batch = await store.leases.claim("w", [d.digest], 10, LEASE)
    assert {t.tenant for t in batch} == {"free"} and len(batch) == 3
    assert await store.leases.claim("w", [d.digest], 10, LEASE) == []
    # Its tasks are nothing an idle worker waits for (`--until-idle` may stop). The next
    # wake-up may be "free"'s rotation bound (its leases' expiry, a lower bound kept after
    # they ended): one early wake, never the paused tenant's tasks.
    await _finish(store, "w", batch)
    pending, _ = await store.tasks.idle_state([d.digest])
    assert pending is False
    await store.tenants.set("held", paused=False)
    pending, _ = await store.tasks.idle_state([d.digest])
    assert pending is True
    resumed = await store.leases.claim("w", [d.digest], 10, LEASE)
    assert {t.tenant for t in resumed} == {"held"} and len(resumed) == 3


# --- max_active -----------------------------------------------------------------------------


async def test_max_active_bounds_the_leases_of_one_claimer(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": i} for i in range(10)], tenant="capped")
    await store.tasks.submit(d, [{"n": i} for i in range(10)], tenant="open")
    await store.tenants.set("capped", max_active=3)
    first = await store.leases.claim("w", [d.digest], 16, LEASE)
    assert Counter(t.tenant for t in first) == {"capped": 3, "open": 10}
    assert await store.leases.claim("w", [d.digest], 16, LEASE) == []  # at the limit
    await _finish(store, "w", [t for t in first if t.tenant == "capped"][:2])
    again = await store.leases.claim("w", [d.digest], 16, LEASE)
    assert Counter(t.tenant for t in again) == {"capped": 2}
    # Lowered below the current count: no lease is revoked, nothing new is claimed.
    await store.tenants.set("capped", max_active=1)
    assert await _active(store, "capped") == 3
    assert await store.leases.claim("w", [d.digest], 16, LEASE) == []
    # No limit any more: the rest comes at once.
    await store.tenants.set("capped", max_active=None)
    assert len(await store.leases.claim("w", [d.digest], 16, LEASE)) == 5


async def test_a_waiting_task_holds_no_slot(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": 1}, {"n": 2}], tenant="capped")
    await store.tenants.set("capped", max_active=1)
    (first,) = await store.leases.claim("w", [d.digest], 10, LEASE)
    assert await store.leases.claim("w", [d.digest], 10, LEASE) == []
    write = FencedWrite(
        first.fence("w"), {"cursor": "first"}, state="waiting", wait_reason="timer",
        delay_seconds=3600,
    )  # fmt: skip
    assert await store.leases.commit(write) == "waiting"
    (second,) = await store.leases.claim("w", [d.digest], 10, LEASE)
    assert second.id != first.id
    record = await store.tenants.get("capped")
    assert (record.active, record.waiting) == (1, 1)


async def test_an_expired_lease_holds_no_slot_and_is_recovered_at_the_limit(
    store: Store,
) -> None:
    d = await _deployed(store)
    (task_id,) = await store.tasks.submit(d, [{"n": 1}], tenant="capped")
    await store.tenants.set("capped", max_active=1)
    (held,) = await store.leases.claim("crashed", [d.digest], 1, LEASE)
    assert await _active(store, "capped") == 1
    await expire_leases(store, task_id)  # the worker crashed: its lease lapsed
    assert await _active(store, "capped") == 0
    (recovered,) = await store.leases.claim("rescuer", [d.digest], 1, LEASE)
    assert (recovered.id, recovered.recovered, recovered.token) == (task_id, True, held.token + 1)
    assert await _active(store, "capped") == 1


_LIMIT_CHECK = """
CREATE FUNCTION test_check_max_active() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    found integer;
    allowed integer;
BEGIN
    SELECT max_active INTO allowed FROM toolkit_tenants WHERE tenant = NEW.tenant;
    IF allowed IS NOT NULL THEN
        -- A query of a volatile function: a fresh snapshot, other claimers' commits seen.
        SELECT count(*) INTO found FROM toolkit_tasks
        WHERE tenant = NEW.tenant AND state = 'leased' AND lease_expires_at > clock_timestamp();
        IF found > allowed THEN
            RAISE EXCEPTION 'tenant % holds % leases, max_active %', NEW.tenant, found, allowed;
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_max_active AFTER UPDATE ON toolkit_tasks
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.state = 'leased')
    EXECUTE FUNCTION test_check_max_active();
"""


# its check is a trigger, which a distributed table cannot have
@pytest.mark.one_postgresql
async def test_the_max_active_check_of_the_race_test_can_fail(store: Store) -> None:
    """The deferred check the race test installs refuses a commit over the limit."""
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": 1}, {"n": 2}], tenant="capped")
    async with store.db.connection() as conn:
        await conn.execute(_LIMIT_CHECK)
    await store.leases.claim("w", [d.digest], 10, LEASE)
    await store.tenants.set("capped", max_active=1)
    with (
        pytest.raises(psycopg.errors.RaiseException, match="holds 2 leases, max_active 1"),
        psycopg.connect(store.db.dsn, autocommit=True) as conn,
    ):
        conn.execute(
            "UPDATE toolkit_tasks SET lease_expires_at = toolkit_seconds_after(lease_expires_at, 1)"
            " WHERE tenant = 'capped'"
        )


# its check is a trigger, which a distributed table cannot have
@pytest.mark.one_postgresql
async def test_max_active_holds_with_four_claimers_racing(store: Store, dsn: str) -> None:
    """Four claimers (own connections) claim, hold their leases while they count, release.

    Checked three ways: a deferred constraint trigger refuses any commit that leaves a tenant
    over its limit (counted with a fresh snapshot at commit), each claimer counts the
    tenant's unexpired leases after every claim while the others hold theirs, and every
    limited tenant must have reached its limit at some point (the race was real).
    """
    d = await _deployed(store)
    limits = {"two": 2, "three": 3}
    for tenant, limit in limits.items():
        await store.tenants.set(tenant, max_active=limit)
        await store.tasks.submit(d, [{"n": i} for i in range(60)], tenant=tenant)
    await store.tasks.submit(d, [{"n": i} for i in range(60)], tenant="open")
    async with store.db.connection() as conn:
        await conn.execute(_LIMIT_CHECK)
    seen: dict[str, list[int]] = {tenant: [] for tenant in limits}
    claimed: list[int] = []

    async def claimer(name: str) -> None:
        async with await Store.open(dsn, pool_size=2, migrate_schema=False) as own:
            while True:
                batch = await own.leases.claim(name, [d.digest], 4, LEASE)
                if not batch:
                    if not (await own.tasks.idle_state([d.digest]))[0]:
                        return
                    await anyio.lowlevel.checkpoint()  # others hold the limited tenants: again
                    continue
                claimed.extend(t.id for t in batch)
                for tenant in limits:
                    seen[tenant].append(await _active(own, tenant))
                await _finish(own, name, batch)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(claimer, f"w{i}")
    assert len(claimed) == len(set(claimed)) == 180  # every task once
    for tenant, limit in limits.items():
        assert max(seen[tenant]) == limit, (tenant, Counter(seen[tenant]))


# --- the settings API and CLI ---------------------------------------------------------------


async def test_settings_and_budgets_round_trip(store: Store) -> None:
    created = await store.tenants.set(
        "acme", max_active=5, weight=2, budgets={"tokens": 10_000, "cost": "2.50"}
    )
    assert (created.max_active, created.weight, created.paused) == (5, 2, False)
    assert created.budgets["tokens"].amount == Decimal(10_000)
    assert created.budgets["cost"].amount == Decimal("2.50")
    assert created.budgets["cost"].used == 0 and created.budgets["cost"].remaining == Decimal("2.5")
    # What is not given stays; a budget's used stays when its amount changes.
    async with store.db.connection() as conn:
        await conn.execute(
            "UPDATE toolkit_tenant_budgets SET used = 400, reserved = 100"
            " WHERE resource = 'tokens'"
        )
    changed = await store.tenants.set_budget("acme", "tokens", 500.5)
    assert (changed.max_active, changed.weight) == (5, 2)
    assert changed.budgets["tokens"].amount == Decimal("500.5")
    assert (changed.budgets["tokens"].used, changed.budgets["tokens"].reserved) == (400, 100)
    cleared = await store.tenants.clear_budget("acme", "cost")
    assert list(cleared.budgets) == ["tokens"]
    assert (await store.tenants.set("acme", paused=True)).paused
    unlimited = await store.tenants.set("acme", max_active=None)
    assert unlimited.max_active is None and unlimited.paused


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_active": 0}, "max_active of tenant 'acme' must be a positive integer"),
        ({"weight": -1}, "weight of tenant 'acme' must be a positive integer"),
        ({"weight": True}, "weight of tenant 'acme' must be a positive integer"),
        ({"budgets": {"tokens": -1}}, "budget 'tokens' of tenant 'acme' must be at least 0"),
        ({"budgets": {"tokens": "lots"}}, "budget 'tokens' of tenant 'acme' must be a number"),
        ({"budgets": {"tokens": float("nan")}}, "must be a finite number"),
    ],
)
async def test_out_of_range_settings_are_refused_before_writing(
    store: Store, change: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        await store.tenants.set("acme", **change)  # type: ignore[arg-type]
    with pytest.raises(UnknownTenant, match="no tenant 'acme'"):
        await store.tenants.get("acme")


def invoke(dsn: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env={"TOOLKIT_DSN": dsn}, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_cli_sets_and_lists_tenants(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "three.yaml").write_text(THREE_STEPS)
    assert invoke(dsn, "deploy", str(tmp_path / "three.yaml"))[0] == 0
    assert invoke(dsn, "submit", "three-steps", "--tenant", "globex")[0] == 0
    code, out, err = invoke(
        dsn, "tenants", "set", "acme", "--max-active", "4", "--weight", "2", "--paused",
        "--budget", "tokens=10000", "--budget", "cost=2.5",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert (
        out == "tenant acme: max active 4, weight 2, paused; budgets: cost 0/2.5, tokens 0/10000\n"
    )
    code, out, err = invoke(dsn, "tenants", "set", "acme", "--no-max-active", "--resumed",
                            "--clear-budget", "cost")  # fmt: skip
    assert out == "tenant acme: no limit, weight 2; budgets: tokens 0/10000\n" and err == ""
    code, out, err = invoke(dsn, "tenants", "set", "acme", "--clear-budget", "cost")
    assert code == 0 and err == "note: tenant acme had no budget 'cost' to clear\n"
    code, out, _ = invoke(dsn, "tenants", "list")
    lines = out.splitlines()
    assert lines[0].split() == [
        "TENANT", "WEIGHT", "MAX", "PAUSED", "QUEUED", "LEASED", "WAITING", "BUDGETS",
        "(used/amount)",
    ]  # fmt: skip
    assert lines[1].split() == ["acme", "2", "-", "no", "0", "0", "0", "tokens", "0/10000"]
    assert lines[2].split() == ["globex", "1", "-", "no", "1", "0", "0", "-"]
    code, out, _ = invoke(dsn, "tenants", "list", "--json")
    rows = json.loads(out)
    assert rows[0]["tenant"] == "acme" and rows[0]["budgets"] == {
        "tokens": {"amount": 10000, "used": 0, "reserved": 0}
    }
    assert rows[1]["queued"] == 1 and rows[1]["max_active"] is None
    with psycopg.connect(dsn, autocommit=True) as conn:  # a live task holds a reservation
        conn.execute("UPDATE toolkit_tenant_budgets SET used = 300, reserved = 200")
    lines = invoke(dsn, "tenants", "list")[1].splitlines()
    assert lines[1].split()[-3:] == ["300/10000", "(200", "reserved)"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "tokens"], "error: --budget tokens: expected RESOURCE=AMOUNT"),
        (["--budget", "tokens=many"], "error: --budget tokens=many: the amount must be a number"),
        (["--max-active", "3", "--no-max-active"], "error: give --max-active or --no-max-active"),
        (["--budget", "t=1", "--clear-budget", "t"], "error: budget 't': given to --budget and"),
    ],
)
def test_cli_refusals_are_one_line_and_write_nothing(
    dsn: str, args: list[str], message: str
) -> None:
    code, out, err = invoke(dsn, "tenants", "set", "acme", *args)
    assert code == 1 and out == ""
    assert err.startswith(message) and len(err.splitlines()) == 1
    assert len(invoke(dsn, "tenants", "list")[1].splitlines()) == 1  # the header alone


# --- one tenant alone -------------------------------------------------------------------------


# one server's fast path for a tenant alone (a distributed claim always goes per tenant)
@pytest.mark.one_postgresql
async def test_a_lone_tenant_is_claimed_from_its_range_until_another_appears(
    store: Store,
) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": i} for i in range(6)], tenant="solo")
    first = await store.leases.claim("w", [d.digest], 2, LEASE)
    assert store.leases._one_tenant == "solo"  # the fair claim saw one tenant
    second = await store.leases.claim("w", [d.digest], 2, LEASE)  # its range alone
    assert [t.tenant for t in first + second] == ["solo"] * 4
    await store.tasks.submit(d, [{"n": 0}, {"n": 1}], tenant="newcomer")
    third = await store.leases.claim("w", [d.digest], 2, LEASE)  # fair again at once
    assert [t.tenant for t in third] == ["newcomer", "newcomer"]
    assert store.leases._one_tenant is None


# one server's fast path for a tenant alone (a distributed claim always goes per tenant)
@pytest.mark.one_postgresql
async def test_a_lone_tenant_paused_is_not_claimed_from(store: Store) -> None:
    d = await _deployed(store)
    await store.tasks.submit(d, [{"n": i} for i in range(4)], tenant="solo")
    await store.leases.claim("w", [d.digest], 1, LEASE)
    assert store.leases._one_tenant == "solo"
    await store.tenants.set("solo", paused=True)
    assert await store.leases.claim("w", [d.digest], 2, LEASE) == []
    assert await store.leases.claim("w", [d.digest], 2, LEASE) == []
