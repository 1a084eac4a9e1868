"""Tenants at scale: does a drain slow down when its tasks are spread over many tenants?

One worker process (``python -m toolkit run --until-idle``, concurrency ``--concurrency``)
drains ``--tasks`` one-step no-op workflows, seeded two ways on fresh databases of one
server, interleaved over ``--rounds`` rounds:

- ``1 tenant``: every task in one tenant (the baseline);
- ``N tenants``: the same tasks spread evenly over ``--tenants`` tenants.

Before each drain, the claim statement itself (``claim_tasks``, a batch of 16, rolled back)
is timed on the seeded database: issue 20's target is its p50 with many tenants at most
twice the single tenant's, and the spread drain at least 0.7 of the baseline's rate. With
``--tasks 100000 --tenants 100000``: every tenant holds one task.

Run: ``.venv/bin/python bench/tenant_scale.py [--tasks 20000] [--tenants 10000]
[--rounds 3] [--concurrency 32] [--dsn SERVER_DSN] [--json PATH]``; without ``--dsn`` a
temporary embedded server is used. All numbers are measurements; nothing here asserts a
timing (``tests/store/test_rotation.py`` checks the behaviour).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
from psycopg.types.json import Jsonb

from bench.concurrency_keys import OneStep
from bench.latency import probe_statements
from bench.processes import run_workers
from bench.side_by_side import Drain, ratio_table
from bench.workload import bench_server, scratch_database, task_states, write_definitions
from toolkit.checkpoint import Checkpoint
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.migrations import migrate

WORKLOAD = OneStep(keyed=False)


async def _seed(dsn: str, tasks: int, tenants: int) -> str:
    """Deploy the workload and insert its tasks (as submits write them) spread over
    ``tenants`` tenants; returns the definition's digest."""
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        definition = WORKLOAD.definition()
        await Store(db).definitions.deploy(definition)
        checkpoint = Jsonb(Checkpoint.initial(definition.start).to_json())
        async with db.connection() as conn:
            await conn.execute(
                "INSERT INTO toolkit_tenants (tenant)"
                " SELECT format('t%%s', n) FROM generate_series(0, %s - 1) n",
                (tenants,),
            )
            await conn.execute(
                "INSERT INTO toolkit_tasks (tenant, definition_name, definition_version,"
                " definition_digest, input, checkpoint)"
                " SELECT format('t%%s', i %% %s), %s, %s, %s, '{}', %s"
                " FROM generate_series(0, %s - 1) i",
                (tenants, definition.name, definition.version, definition.digest,
                 checkpoint, tasks),
            )  # fmt: skip
            await conn.execute("ANALYZE")
        return definition.digest
    finally:
        await db.close()


@dataclasses.dataclass(frozen=True)
class Measured:
    """One variant's drain and its claim statement's p50 (ms) before the drain."""

    drain: Drain
    claim_p50: float


def measure(server: str, name: str, tasks: int, tenants: int, concurrency: int) -> Measured:
    """Seed a fresh database, time the claim statement, then drain it with one worker."""
    with scratch_database(server, "bench_tenants") as dsn, tempfile.TemporaryDirectory(
        prefix="bench-tenants-"
    ) as folder:
        digest = anyio.run(_seed, dsn, tasks, tenants)
        probe = probe_statements(dsn, [digest], samples=50)
        run = run_workers(dsn, write_definitions(Path(folder), [WORKLOAD]), concurrency)
        states = task_states(dsn)
        if states != {"succeeded": tasks}:
            raise SystemExit(f"{name}: the drain ended with {states}; reports {run.reports}")
    return Measured(Drain(name, tasks, run.wall, run.cpu), probe.claim.p50)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dsn", help="a server DSN (default: a temporary embedded server)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    spread = f"{args.tenants:,} tenants"
    rounds: list[dict[str, Measured]] = []
    with bench_server(args.dsn) as server:
        for _ in range(args.rounds):
            rounds.append({
                "1 tenant": measure(server, "1 tenant", args.tasks, 1, args.concurrency),
                spread: measure(server, spread, args.tasks, args.tenants, args.concurrency),
            })  # fmt: skip
    print(f"{args.tasks:,} one-step tasks, one worker at concurrency {args.concurrency}, "
          f"{args.rounds} rounds")  # fmt: skip
    print(ratio_table([{k: m.drain for k, m in r.items()} for r in rounds], "task", "1 tenant"))
    ratios = [r[spread].claim_p50 / r["1 tenant"].claim_p50 for r in rounds]
    print(
        f"\nclaim_tasks p50 (batch 16): 1 tenant "
        f"{statistics.median(r['1 tenant'].claim_p50 for r in rounds):.2f} ms, {spread} "
        f"{statistics.median(r[spread].claim_p50 for r in rounds):.2f} ms "
        f"({statistics.median(ratios):.2f}x, same round)"
    )
    if args.json:
        args.json.write_text(json.dumps([{k: dataclasses.asdict(m) for k, m in r.items()}
                                         for r in rounds], indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
