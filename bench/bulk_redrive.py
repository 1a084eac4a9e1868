"""What a bulk redrive costs per task, against redriving the same tasks one by one.

N tasks of a three-step definition (two steps that complete, a third that fails: the "bug")
fail on one in-process worker. Then the same N failed tasks are redriven two ways, side by
side in one invocation, each in a database of its own:

- ``bulk``: ``store.bulk.plan_redrive`` over a filter (the preview plans each task), then
  ``store.bulk.apply`` (each task re-planned and redriven in its own transaction);
- ``one by one``: ``store.tasks.redrive`` of each task, as N ``toolkit redrive`` commands
  would (each one plans, then applies).

Columns: milliseconds per task of the bulk plan (preview), the bulk apply and the whole
bulk redrive; of the one-by-one loop; and the ratio bulk / one-by-one (median over
``--repeat`` rounds). How the cost per task grows with N is read down the column. Nothing
here asserts a timing.

Run: ``.venv/bin/python bench/bulk_redrive.py [--sizes 100,1000] [--repeat 2]
[--dsn SERVER]``; without ``--dsn`` a temporary embedded server is used.
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

import toolkit
from bench.workload import bench_server, scratch_database
from toolkit.definition import parse_definition
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Database, Store
from toolkit.store.filters import TaskFilter
from toolkit.store.migrations import migrate

app = toolkit.App("bench-bulk-redrive")


class Broken(Exception):
    """The bug of the third step."""


@app.effect("bench.step")
async def step(ctx: toolkit.EffectContext, broken: bool = False) -> dict[str, Any]:
    if broken:
        raise Broken("broken step")
    return {"step": ctx.step}


DEFINITION = parse_definition(
    """
name: bench-bulk-redrive
version: 1
start: one
steps:
  one: {effect: bench.step, idempotent: true, next: two}
  two: {effect: bench.step, idempotent: false, next: three}
  three:
    effect: bench.step
    idempotent: true
    args: {broken: true}
    retry: {max_attempts: 1}
""",
    source="<bench-bulk-redrive>",
)
CONFIG = SupervisorConfig(
    until_idle=True, lease=60.0, heartbeat=5.0, idle_backoff_min=0.01, idle_backoff_max=0.05
)


async def _failed_tasks(dsn: str, n: int) -> tuple[Database, Store, list[int]]:
    db = await Database.connect(dsn)
    await migrate(db)
    store = Store(db)
    await store.definitions.deploy(DEFINITION)
    ids = await store.tasks.submit(DEFINITION, [{}] * n)
    await WorkflowSupervisor(Worker(store, app, [DEFINITION]), CONFIG).run()
    return db, store, ids


async def _bulk(dsn: str, n: int) -> dict[str, float]:
    db, store, _ = await _failed_tasks(dsn, n)
    try:
        started = time.perf_counter()
        plan = await store.bulk.plan_redrive(TaskFilter(state="failed"))
        planned = time.perf_counter()
        applied = await store.bulk.apply(plan.id)
        done = time.perf_counter()
        if applied.applied != n:
            raise SystemExit(f"bulk redrive applied {applied.applied} of {n}: {applied}")
    finally:
        await db.close()
    return {"plan": (planned - started) * 1000 / n, "apply": (done - planned) * 1000 / n,
            "total": (done - started) * 1000 / n}  # fmt: skip


async def _one_by_one(dsn: str, n: int) -> dict[str, float]:
    db, store, ids = await _failed_tasks(dsn, n)
    try:
        started = time.perf_counter()
        for task_id in ids:
            await store.tasks.redrive(task_id)
        done = time.perf_counter()
    finally:
        await db.close()
    return {"total": (done - started) * 1000 / n}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dsn", default=None, help="a server to use (default: embedded)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    rounds: list[dict[int, dict[str, dict[str, float]]]] = []
    with bench_server(args.dsn) as server:
        for number in range(args.repeat):
            figures: dict[int, dict[str, dict[str, float]]] = {}
            for size in sizes:
                figures[size] = {}
                for way, run in (("bulk", _bulk), ("one", _one_by_one)):
                    with scratch_database(server, f"bench_bulk_redrive_{way}") as dsn:
                        figures[size][way] = anyio.run(run, dsn, size)
                print(f"round {number + 1}, N={size}: {figures[size]}", file=sys.stderr)
            rounds.append(figures)

    def median(size: int, way: str, key: str) -> float:
        return statistics.median(r[size][way][key] for r in rounds)

    print("| tasks | bulk plan / task | bulk apply / task | bulk / task | one by one / task "
          "| ratio bulk / one by one |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        ratio = statistics.median(r[size]["bulk"]["total"] / r[size]["one"]["total"]
                                  for r in rounds)  # fmt: skip
        print(
            f"| {size:,} | {median(size, 'bulk', 'plan'):.2f} ms"
            f" | {median(size, 'bulk', 'apply'):.2f} ms | {median(size, 'bulk', 'total'):.2f} ms"
            f" | {median(size, 'one', 'total'):.2f} ms | {ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
