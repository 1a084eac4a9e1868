"""A map's cost per item as the map grows: worker CPU, WAL and wall time per item.

One task runs a ``map`` of N items, each one idempotent no-op effect, ``max_concurrency``
32, on one in-process worker; for each N the run is measured side by side in one
invocation (sizes interleaved over ``--repeat`` rounds):

- ``worker CPU / item``: CPU time of this process (the worker) over the run, per item;
- ``WAL / item``: bytes of write-ahead log the server wrote over the run, per item
  (``pg_current_wal_lsn`` before and after; the embedded server runs nothing else);
- ``wall / item``: from submit to the task's end, per item.

The last columns are each figure's ratio to the smallest N of the same round: a map whose
cost is linear in its items keeps them near 1 (issue 18's target: within 1.5 at 10,000
items against 10).

Run: ``.venv/bin/python bench/map_items.py [--sizes 10,1000,10000] [--repeat 2]
[--dsn SERVER]``; without ``--dsn`` a temporary embedded server is used. Nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import psycopg

from bench.noop_app import NOOP_HANDLER
from bench.noop_app import app as noop_app
from bench.workload import bench_server, scratch_database
from toolkit.definition import parse_definition
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Database, Store
from toolkit.store.migrations import migrate

DEFINITION = parse_definition(
    f"""
name: bench-map
version: 1
input: {{type: object, properties: {{n: {{type: integer}}}}}}
start: items
steps:
  items:
    map:
      items: "${{ input.items }}"
      max_concurrency: 32
      branch:
        start: call
        steps:
          call: {{effect: {NOOP_HANDLER}, idempotent: true}}
""",
    source="<bench-map>",
)


def _wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


async def _run_map(dsn: str, items: int) -> dict[str, float]:
    """Run one map of ``items`` items to its end; its per-item figures."""
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        store = Store(db)
        await store.definitions.deploy(DEFINITION)
        wal = _wal_lsn(dsn)
        cpu = time.process_time()
        wall = time.perf_counter()
        [task_id] = await store.tasks.submit(DEFINITION, [{"items": list(range(items))}])
        worker = Worker(store, noop_app, [DEFINITION])
        config = SupervisorConfig(
            until_idle=True, lease=60.0, heartbeat=5.0, idle_backoff_min=0.01,
            idle_backoff_max=0.05,
        )  # fmt: skip
        await WorkflowSupervisor(worker, config).run()
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        wal = _wal_lsn(dsn) - wal
        task = await store.tasks.get(task_id)
        if task.state != "succeeded":
            raise SystemExit(f"the map of {items} items did not succeed: {task}")
    finally:
        await db.close()
    return {"cpu_ms": cpu * 1000 / items, "wal_bytes": wal / items, "wall_ms": wall * 1000 / items}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dsn", default=None, help="a server to use (default: embedded)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    rounds: list[dict[int, dict[str, float]]] = []
    with bench_server(args.dsn) as server:
        for number in range(args.repeat):
            figures: dict[int, dict[str, float]] = {}
            for size in sizes:
                with scratch_database(server, f"bench_map_{number}_{size}") as dsn:
                    figures[size] = anyio.run(_run_map, dsn, size)
                print(f"round {number + 1}, N={size}: {figures[size]}", file=sys.stderr)
            rounds.append(figures)
    base = sizes[0]

    def median(size: int, key: str, ratio: bool = False) -> float:
        values = [
            r[size][key] / r[base][key] if ratio else r[size][key] for r in rounds
        ]
        return statistics.median(values)

    print(
        "| items | worker CPU / item | WAL / item | wall / item "
        f"| CPU ratio to N={base} | WAL ratio | wall ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        row: list[Any] = [
            f"{size:,}", f"{median(size, 'cpu_ms'):.2f} ms", f"{median(size, 'wal_bytes'):,.0f} B",
            f"{median(size, 'wall_ms'):.2f} ms", f"{median(size, 'cpu_ms', True):.2f}",
            f"{median(size, 'wal_bytes', True):.2f}", f"{median(size, 'wall_ms', True):.2f}",
        ]  # fmt: skip
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
