"""Downstream limits: what acquiring a limit costs a drain, side by side in one run.

One worker process (``python -m toolkit run --until-idle``, concurrency ``--concurrency``)
drains ``--tasks`` one-step no-op workflows, two ways, interleaved over ``--rounds`` rounds on
fresh databases of one server:

- ``plain``: the step names no limit (the baseline);
- ``limited``: the step names a limit (``limits: [bench_wide]``) with a ``max_concurrency``
  far above the worker's concurrency, so that every call acquires a slot and none waits:
  the cost of the acquisition itself (its statements, docs/limits.md).

Reported per variant: the median rate (tasks/s from spawn to exit), worker CPU per task (ms)
and the ratio of each rate to the plain one in the same round (median over rounds). All
numbers are measurements; nothing here asserts a timing (``tests/process/test_limits.py``
checks the behaviour).

Run: ``.venv/bin/python bench/limits.py [--tasks 5000] [--rounds 3] [--concurrency 32]
[--dsn SERVER_DSN] [--json PATH]``; without ``--dsn`` a temporary embedded server is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio

from bench.noop_app import NOOP_HANDLER
from bench.processes import run_workers
from bench.side_by_side import Drain, ratio_table
from bench.workload import bench_server, scratch_database, seed, task_states, write_definitions
from toolkit.definition import WorkflowDefinition, parse_definition
from toolkit.store import Store
from toolkit.store.database import Database

VARIANTS = ("plain", "limited")

#: The limit every call of the limited variant acquires: never full.
LIMIT = "bench_wide"


@dataclasses.dataclass(frozen=True)
class OneStep:
    """A one-step no-op definition whose step names the limit, or not."""

    limited: bool

    @property
    def name(self) -> str:
        return "bench-limited" if self.limited else "bench-unlimited"

    def yaml(self) -> str:
        limits = f", limits: [{LIMIT}]" if self.limited else ""
        return (
            f"name: {self.name}\nversion: 1\ninput: {{type: object}}\nstart: s1\n"
            f"steps:\n  s1: {{effect: {NOOP_HANDLER}, idempotent: true{limits}}}\n"
        )

    def definition(self) -> WorkflowDefinition:
        return parse_definition(self.yaml(), source=f"<{self.name}>")


async def _set_limit(dsn: str) -> None:
    """The limit the limited variant names, never full (set in both variants alike)."""
    db = await Database.connect(dsn)
    try:
        await Store(db).limits.set(LIMIT, max_concurrency=1_000_000)
    finally:
        await db.close()


def drain(server: str, variant: str, tasks: int, concurrency: int) -> Drain:
    """Seed a fresh database with the variant's tasks and drain it with one worker."""
    workload = OneStep(limited=variant == "limited")
    with scratch_database(server, f"bench_limits_{variant}") as dsn, tempfile.TemporaryDirectory(
        prefix="bench-limits-"
    ) as folder:
        seed(dsn, workload, tasks)
        anyio.run(_set_limit, dsn)
        run = run_workers(dsn, write_definitions(Path(folder), [workload]), concurrency)
        states = task_states(dsn)
        if states != {"succeeded": tasks}:
            raise SystemExit(f"{variant}: the drain ended with {states}; reports {run.reports}")
    return Drain(variant, tasks, run.wall, run.cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dsn", help="a server DSN (default: a temporary embedded server)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    rounds = []
    with bench_server(args.dsn) as server:
        for _ in range(args.rounds):
            rounds.append({v: drain(server, v, args.tasks, args.concurrency) for v in VARIANTS})
    print(f"{args.tasks} one-step tasks, one worker at concurrency {args.concurrency}, "
          f"{args.rounds} rounds")  # fmt: skip
    print(ratio_table(rounds, "task", "plain"))
    if args.json:
        args.json.write_text(json.dumps([{k: dataclasses.asdict(v) for k, v in r.items()}
                                         for r in rounds], indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
