"""One PostgreSQL against a Citus cluster, the same workload side by side (issue 25).

Each round, on each layout in turn (alternating which goes first):

1. a fresh store: on one PostgreSQL a scratch database; on the cluster its database (named
   by ``--citus-dsn``, used by nothing else: the bench drops the toolkit's tables in it)
   emptied, migrated and distributed (``toolkit db migrate --distribute --shards S``);
2. the claim's latency: N one-step no-op workflows over T tenants are submitted, then
   claimed by batches of 16 until none is left (``Leases.claim``, in process, each claim
   timed; the tasks stay leased);
3. the drain: the store emptied and seeded again the same way, one worker process
   (``toolkit run --until-idle``, concurrency C) drains it: workflows/s, the worker's CPU,
   and each server's CPU (on the cluster: the coordinator's and each worker node's, read from
   their process trees, so every node must run on this machine).

On one machine the cluster shows its overhead, not its scale-out: every node shares the same
two cores. The per-node CPU tells how the load splits, which is what a cluster of machines
would spread. Nothing here asserts a timing.

Run: ``.venv/bin/python bench/citus.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
--citus-dsn postgresql://postgres@127.0.0.1:9700/toolkit_citus [--tasks N] [--tenants T]
[--concurrency C] [--rounds R] [--shards S]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import psycopg

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.processes import run_workers
from bench.workload import (
    SUBMIT_CHUNK,
    Workload,
    percentiles,
    scratch_database,
    server_cpu,
    write_definitions,
)
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.distribution import distribute
from toolkit.store.migrations import migrate

WORKLOAD = Workload(steps=1, idempotent=True)
#: Tasks per claim of the latency probe (a worker's batch at concurrency 16).
CLAIM_BATCH = 16

#: The toolkit's tables of a cluster's database. The coordinator holds reference tables'
#: shards too (toolkit_definitions_102458): a toolkit table's name never ends in digits, a
#: shard's always does.
TOOLKIT_TABLES = r"""
SELECT c.oid::regclass FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
  AND c.relname LIKE 'toolkit\_%' AND c.relname !~ '_[0-9]+$'
"""
_TOOLKIT_FUNCTIONS = r"""
SELECT p.oid::regprocedure FROM pg_proc p
WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'toolkit\_%'
"""
_NODES = "SELECT nodename, nodeport FROM pg_dist_node WHERE isactive ORDER BY nodeport"
#: Each worker node's tasks and tenants: the node that holds each tenant's shard.
_TASKS_PER_NODE = """
WITH per_tenant AS (SELECT tenant, count(*) AS tasks FROM toolkit_tasks GROUP BY tenant)
SELECT s.nodename || ':' || s.nodeport AS node, sum(p.tasks)::bigint AS tasks,
       count(*) AS tenants
FROM per_tenant p
JOIN citus_shards s
  ON s.shardid = get_shard_id_for_distribution_column('toolkit_tasks', p.tenant)
GROUP BY 1
ORDER BY 1
"""


@dataclasses.dataclass(frozen=True)
class Round:
    """One layout's measures in one round.

    Attributes:
        layout: ``one PostgreSQL`` or ``Citus``.
        claim_ms: each claim's latency, milliseconds.
        wall: the drain's seconds, first spawn to last exit.
        worker_cpu: the worker process's CPU seconds.
        node_cpu: each server's CPU seconds during the drain, by ``host:port``.
        tasks: workflows drained.
    """

    layout: str
    claim_ms: list[float]
    wall: float
    worker_cpu: float
    node_cpu: dict[str, float]
    tasks: int


def drop_toolkit_objects(dsn: str) -> None:
    """Drop every toolkit table and function of a cluster's database (on every node)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (table,) in conn.execute(TOOLKIT_TABLES).fetchall():
            conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        for (function,) in conn.execute(_TOOLKIT_FUNCTIONS).fetchall():
            conn.execute(f"DROP FUNCTION IF EXISTS {function} CASCADE")


def tasks_per_node(dsn: str) -> list[tuple[str, int, int]]:
    """``(host:port, tasks, tenants)`` of each worker node of a distributed store."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [(node, tasks, tenants) for node, tasks, tenants in conn.execute(_TASKS_PER_NODE)]


def _nodes(citus_dsn: str) -> list[str]:
    """The DSN of the bench's database on every node of the cluster."""
    with psycopg.connect(citus_dsn, autocommit=True) as conn:
        nodes = conn.execute(_NODES).fetchall()
    base = psycopg.conninfo.conninfo_to_dict(citus_dsn)
    return [
        psycopg.conninfo.make_conninfo(**{**base, "host": host, "port": str(port)})
        for host, port in nodes
    ]


async def _layout(dsn: str, shards: int | None) -> None:
    """Migrated; distributed over ``shards`` shards a table unless None (one PostgreSQL)."""
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        if shards is not None:
            await distribute(db, shards=shards)
    finally:
        await db.close()


async def _submit(dsn: str, tasks: int, tenants: int) -> None:
    async with await Store.open(dsn, migrate_schema=False) as store:
        definition = WORKLOAD.definition()
        await store.definitions.deploy(definition)
        for tenant in range(tenants):
            inputs = [{"i": i} for i in range(tenant, tasks, tenants)]
            for start in range(0, len(inputs), SUBMIT_CHUNK):
                await store.tasks.submit(
                    definition, inputs[start : start + SUBMIT_CHUNK], tenant=f"tenant-{tenant}"
                )


async def _claims(dsn: str) -> list[float]:
    """Claim batches until none is left; each claim's milliseconds."""
    async with await Store.open(dsn, migrate_schema=False) as store:
        digests = [WORKLOAD.definition().digest]
        timings = []
        while True:
            started = time.perf_counter()
            claimed = await store.leases.claim("bench-probe", digests, CLAIM_BATCH, 300.0)
            timings.append((time.perf_counter() - started) * 1000)
            if not claimed:
                return timings


@contextlib.contextmanager
def _store(layout: str, args: argparse.Namespace, name: str) -> Iterator[str]:
    """A fresh, laid out, empty store of ``layout``."""
    if layout == "Citus":
        drop_toolkit_objects(args.citus_dsn)
        anyio.run(_layout, args.citus_dsn, args.shards)
        yield args.citus_dsn
        return
    with scratch_database(args.dsn, name) as dsn:
        anyio.run(_layout, dsn, None)
        yield dsn


def measure(layout: str, args: argparse.Namespace, definitions: Path) -> Round:
    """One layout's claim probe and drain (a fresh store for each)."""
    with _store(layout, args, "runifold_bench_citus_probe") as dsn:
        anyio.run(_submit, dsn, args.tasks, args.tenants)
        claim_ms = anyio.run(_claims, dsn)
    with _store(layout, args, "runifold_bench_citus_drain") as dsn:
        anyio.run(_submit, dsn, args.tasks, args.tenants)
        servers = _nodes(dsn) if layout == "Citus" else [dsn]
        before = {server: server_cpu(server) or 0.0 for server in servers}
        run = run_workers(dsn, definitions, args.concurrency, name=f"bench-{layout[:4].lower()}")
        node_cpu = {
            _address(server): (server_cpu(server) or 0.0) - before[server] for server in servers
        }
    return Round(layout, claim_ms, run.wall, run.cpu, node_cpu, run.succeeded)


def _address(dsn: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"{params.get('host', '')}:{params.get('port', 5432)}"


def report(rounds: Sequence[Round], args: argparse.Namespace) -> str:
    """The rounds side by side, then the medians and the cluster's ratios to one server."""
    lines = [
        f"{args.tasks} one-step workflows over {args.tenants} tenants, one worker at"
        f" concurrency {args.concurrency}; probe claims of {CLAIM_BATCH}; the cluster's tables in"
        f" {args.shards} shards each",
        "",
        "| round | layout | drain wf/s | claim p50 / p99 ms | worker CPU ms/wf |"
        " server CPU ms/wf (per node) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for index, r in enumerate(rounds):
        nodes = ", ".join(f"{node} {cpu * 1000 / r.tasks:.2f}" for node, cpu in r.node_cpu.items())
        claims = percentiles(r.claim_ms)
        lines.append(
            f"| {index // 2 + 1} | {r.layout} | {r.tasks / r.wall:,.0f} |"
            f" {claims.p50:.1f} / {claims.p99:.1f} | {r.worker_cpu * 1000 / r.tasks:.2f} |"
            f" {sum(r.node_cpu.values()) * 1000 / r.tasks:.2f} ({nodes}) |"
        )
    medians = {}
    for layout in ("one PostgreSQL", "Citus"):
        mine = [r for r in rounds if r.layout == layout]
        medians[layout] = (
            statistics.median(r.tasks / r.wall for r in mine),
            statistics.median(percentiles(r.claim_ms).p50 for r in mine),
        )
    rate = medians["Citus"][0] / medians["one PostgreSQL"][0]
    claim = medians["Citus"][1] / medians["one PostgreSQL"][1]
    lines += [
        "",
        f"medians: drain {medians['one PostgreSQL'][0]:,.0f} (one PostgreSQL) vs"
        f" {medians['Citus'][0]:,.0f} wf/s (Citus): ratio {rate:.2f}; claim p50"
        f" {medians['one PostgreSQL'][1]:.1f} vs {medians['Citus'][1]:.1f} ms: ratio {claim:.2f}",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="one PostgreSQL (its maintenance DB)")
    parser.add_argument("--citus-dsn", required=True, help="the coordinator's bench database")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--shards", type=int, default=4, help="shards per table on the cluster (--distribute)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="runifold-bench-citus-") as temp:
        definitions = write_definitions(Path(temp), [WORKLOAD])
        for index in range(args.rounds):
            order = ["one PostgreSQL", "Citus"]
            measured = {}
            for layout in order if index % 2 == 0 else order[::-1]:  # alternating the first
                measured[layout] = measure(layout, args, definitions)
                print(f"round {index + 1} {layout}: done", file=sys.stderr)
            rounds += [measured[layout] for layout in order]
    print(report(rounds, args))


if __name__ == "__main__":
    main()
