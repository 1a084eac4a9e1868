"""What a redrive costs against running the work again: a map whose last items failed.

One task runs a ``map`` of N items (one idempotent effect each, ``max_concurrency`` 32) on
one in-process worker; its last ``--failed`` items fail (the "bug"). After the fix, the
same work is brought to its end two ways, side by side in one invocation:

- ``redrive``: ``store.tasks.redrive`` of the failed task (the plan, its apply) and the
  worker run that finishes it: only the failed items run again;
- ``new task``: a new task of the same input, every item called again.

Columns: handler calls, worker CPU (this process) and wall time of each way, and the
redrive's ratio to the new task (median over ``--repeat`` rounds). ``plan`` is the wall
time of planning the redrive alone (a dry run). Nothing here asserts a timing.

Run: ``.venv/bin/python bench/redrive.py [--sizes 1000,10000] [--failed 10] [--repeat 2]
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
from toolkit.store.migrations import migrate

app = toolkit.App("bench-redrive")
#: Whether the "bug" is fixed, and the handler calls so far.
STATE: dict[str, Any] = {"fixed": False, "calls": 0}


class Broken(Exception):
    """The bug of the last items, until it is fixed."""


@app.effect("bench.until_fixed")
async def until_fixed(ctx: toolkit.EffectContext, broken: bool = False) -> dict[str, Any]:
    STATE["calls"] += 1
    if broken and not STATE["fixed"]:
        raise Broken("broken item")
    return {}


DEFINITION = parse_definition(
    """
name: bench-redrive
version: 1
start: items
steps:
  items:
    map:
      items: "${ input.items }"
      max_concurrency: 32
      branch:
        start: call
        steps:
          call:
            effect: bench.until_fixed
            idempotent: true
            args: {broken: "${ context.item }"}
            retry: {max_attempts: 1}
""",
    source="<bench-redrive>",
)
CONFIG = SupervisorConfig(
    until_idle=True, lease=60.0, heartbeat=5.0, idle_backoff_min=0.01, idle_backoff_max=0.05
)


async def _drain(store: Store) -> None:
    await WorkflowSupervisor(Worker(store, app, [DEFINITION]), CONFIG).run()


async def _measure(store: Store, action: Any) -> dict[str, float]:
    STATE["calls"] = 0
    cpu, wall = time.process_time(), time.perf_counter()
    task_id = await action()
    await _drain(store)
    figures = {
        "calls": float(STATE["calls"]),
        "cpu_ms": (time.process_time() - cpu) * 1000,
        "wall_ms": (time.perf_counter() - wall) * 1000,
    }
    task = await store.tasks.get(task_id)
    if task.state != "succeeded":
        raise SystemExit(f"task {task_id} did not succeed: {task.state} {task.error}")
    return figures


async def _round(dsn: str, items: int, failed: int) -> dict[str, dict[str, float]]:
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        store = Store(db)
        await store.definitions.deploy(DEFINITION)
        data = {"items": [index >= items - failed for index in range(items)]}
        STATE["fixed"] = False
        [failed_id] = await store.tasks.submit(DEFINITION, [data])
        await _drain(store)
        assert (await store.tasks.get(failed_id)).state == "failed"
        STATE["fixed"] = True
        plan_wall = time.perf_counter()
        await store.tasks.redrive(failed_id, dry_run=True)
        plan_ms = (time.perf_counter() - plan_wall) * 1000

        async def redrive() -> int:
            await store.tasks.redrive(failed_id)
            return failed_id

        async def new_task() -> int:
            [task_id] = await store.tasks.submit(DEFINITION, [data])
            return task_id

        redriven = await _measure(store, redrive)
        fresh = await _measure(store, new_task)
    finally:
        await db.close()
    return {"redrive": {**redriven, "plan_ms": plan_ms}, "new": fresh}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--failed", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dsn", default=None, help="a server to use (default: embedded)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    rounds: list[dict[int, dict[str, dict[str, float]]]] = []
    with bench_server(args.dsn) as server:
        for number in range(args.repeat):
            figures = {}
            for size in sizes:
                with scratch_database(server, f"bench_redrive_{number}_{size}") as dsn:
                    figures[size] = anyio.run(_round, dsn, size, args.failed)
                print(f"round {number + 1}, N={size}: {figures[size]}", file=sys.stderr)
            rounds.append(figures)

    def median(size: int, way: str, key: str) -> float:
        return statistics.median(r[size][way][key] for r in rounds)

    def ratio(size: int, key: str) -> float:
        return statistics.median(r[size]["redrive"][key] / r[size]["new"][key] for r in rounds)

    print(
        "| items (failed) | plan | redrive: calls, CPU, wall | new task: calls, CPU, wall "
        "| CPU ratio | wall ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        row = [
            f"{size:,} ({args.failed})", f"{median(size, 'redrive', 'plan_ms'):.1f} ms",
            f"{median(size, 'redrive', 'calls'):.0f}, {median(size, 'redrive', 'cpu_ms'):.0f} ms,"
            f" {median(size, 'redrive', 'wall_ms'):.0f} ms",
            f"{median(size, 'new', 'calls'):.0f}, {median(size, 'new', 'cpu_ms'):.0f} ms,"
            f" {median(size, 'new', 'wall_ms'):.0f} ms",
            f"{ratio(size, 'cpu_ms'):.3f}", f"{ratio(size, 'wall_ms'):.3f}",
        ]  # fmt: skip
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
