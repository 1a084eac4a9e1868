"""A distributed map as it grows: the worker's peak memory, CPU and rate per item.

One task runs a ``map: {distributed: true}`` of N items listed from an effect in pages of
1,000, each item a child task of a one-step no-op workflow (``--max-concurrency``: none by
default); one
worker process (``python -m toolkit run --until-idle``, concurrency 32) lists, runs and
counts them all. For each N, side by side in one invocation (sizes interleaved over
``--repeat`` rounds), on a fresh database each:

- ``peak RSS``: the worker process's peak resident memory (``VmHWM``);
- ``worker CPU / item``: its user + system CPU over the run, per item;
- ``items/s``: items over the worker's wall time (spawn to exit).

The last column is the peak RSS's ratio to the smallest N of the same round: the worker
holds one page, never the list, so it stays near 1 (issue 22's target: within 1.2 at
20,000 items against 1,000).

Run: ``.venv/bin/python bench/distributed_map.py [--sizes 1000,20000] [--repeat 2]
[--dsn SERVER]``; without ``--dsn`` a temporary embedded server is used. Nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio

from bench.noop_app import NOOP_HANDLER
from bench.processes import run_workers
from bench.workload import bench_server, scratch_database
from toolkit.definition import parse_definition
from toolkit.store import Database, Store
from toolkit.store.migrations import migrate

ITEM = f"""
name: bench-item
version: 1
start: call
steps:
  call: {{effect: {NOOP_HANDLER}, idempotent: true}}
"""

PARENT = """
name: bench-distributed-map
version: 1
input: {type: object, required: [total], properties: {total: {type: integer}}}
start: each
steps:
  each:
    map:
      distributed: true
      items_from: {effect: bench.pages, args: {total: "${ input.total }", size: 1000}}
      workflow: {name: bench-item}
"""


def parent_text(max_concurrency: int | None) -> str:
    """The map's definition, its children bounded by ``max_concurrency`` when given."""
    if max_concurrency is None:
        return PARENT
    return PARENT + f"      max_concurrency: {max_concurrency}\n"


async def _seed(dsn: str, items: int, text: str) -> int:
    """Migrate, deploy both definitions (the map's is ``text``), submit the map; its id."""
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        store = Store(db)
        parent = parse_definition(text, source="<bench>")
        await store.definitions.deploy(parse_definition(ITEM, source="<bench>"))
        await store.definitions.deploy(parent)
        [task_id] = await store.tasks.submit(parent, [{"total": items}])
        return task_id
    finally:
        await db.close()


async def _outcome(dsn: str, task_id: int) -> Any:
    db = await Database.connect(dsn)
    try:
        return await Store(db).tasks.get(task_id)
    finally:
        await db.close()


def run_map(dsn: str, items: int, folder: Path, text: str) -> dict[str, float]:
    """Run one distributed map of ``items`` items to its end in one worker process."""
    task_id = anyio.run(_seed, dsn, items, text)
    run = run_workers(dsn, folder, 32, name="bench-map")
    task = anyio.run(_outcome, dsn, task_id)
    if task.state != "succeeded" or task.result["succeeded"] != items:
        raise SystemExit(f"the map of {items} items did not succeed: {task.state} {task.result}")
    return {
        "rss_mib": run.peak_rss / 2**20, "cpu_ms": run.cpu * 1000 / items,
        "rate": items / run.wall,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", default="1000,20000")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dsn", default=None, help="a server to use (default: embedded)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="the map's max_concurrency (default: none)")  # fmt: skip
    args = parser.parse_args(argv)
    text = parent_text(args.max_concurrency)
    sizes = [int(size) for size in args.sizes.split(",")]
    rounds: list[dict[int, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="runifold-bench-map-") as temp:
        folder = Path(temp)
        (folder / "item.yaml").write_text(ITEM, encoding="utf-8")
        (folder / "map.yaml").write_text(text, encoding="utf-8")
        with bench_server(args.dsn) as server:
            for number in range(args.repeat):
                figures: dict[int, dict[str, float]] = {}
                for size in sizes:
                    with scratch_database(server, f"bench_dmap_{number}_{size}") as dsn:
                        figures[size] = run_map(dsn, size, folder, text)
                    print(f"round {number + 1}, N={size}: {figures[size]}", file=sys.stderr)
                rounds.append(figures)
    base = sizes[0]

    def median(size: int, key: str, ratio: bool = False) -> float:
        return statistics.median(
            r[size][key] / r[base][key] if ratio else r[size][key] for r in rounds
        )

    print(f"| items | peak RSS | worker CPU / item | items/s | RSS ratio to N={base} |")
    print("| --- | --- | --- | --- | --- |")
    for size in sizes:
        row = [
            f"{size:,}", f"{median(size, 'rss_mib'):.1f} MiB", f"{median(size, 'cpu_ms'):.2f} ms",
            f"{median(size, 'rate'):,.0f}", f"{median(size, 'rss_mib', True):.2f}",
        ]  # fmt: skip
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
