"""Concurrency keys: what holding a key per task costs a drain, side by side in one run.

One worker process (``python -m toolkit run --until-idle``, concurrency ``--concurrency``)
drains ``--tasks`` one-step no-op workflows, three ways, interleaved over ``--rounds`` rounds
on fresh databases of one server:

- ``plain``: no concurrency key (the baseline);
- ``distinct``: ``concurrency: {key: ${ input.account }, max_active: 1}``, every task its
  own key (``--tasks`` distinct keys): the cost of admission, independent of contention;
- ``shared``: the same definition over ``--keys`` keys (tasks of one key run one at a time,
  in submission order).

Reported per variant: the median rate (tasks/s from spawn to exit), worker CPU per task (ms)
and the ratio of each rate to the plain one in the same round (median over rounds). Issue
20's target: ``distinct`` at least 0.7 of ``plain``. All numbers are measurements; nothing here
asserts a timing (``tests/process/test_concurrency_keys.py`` checks the behaviour).

Run: ``.venv/bin/python bench/concurrency_keys.py [--tasks 10000] [--keys 100]
[--rounds 3] [--concurrency 32] [--dsn SERVER_DSN] [--json PATH]``; without ``--dsn`` a
temporary embedded server is used.
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
from bench.workload import (
    SUBMIT_CHUNK,
    bench_server,
    scratch_database,
    task_states,
    write_definitions,
)
from toolkit.definition import WorkflowDefinition, parse_definition
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.migrations import migrate

VARIANTS = ("plain", "distinct", "shared")


@dataclasses.dataclass(frozen=True)
class OneStep:
    """A one-step no-op definition, with a concurrency key over ``input.account`` or not."""

    keyed: bool

    @property
    def name(self) -> str:
        return "bench-keyed" if self.keyed else "bench-unkeyed"

    def yaml(self) -> str:
        key = 'concurrency: {key: "${ input.account }", max_active: 1}\n' if self.keyed else ""
        return (
            f"name: {self.name}\nversion: 1\ninput: {{type: object}}\n{key}start: s1\n"
            f"steps:\n  s1: {{effect: {NOOP_HANDLER}, idempotent: true}}\n"
        )

    def definition(self) -> WorkflowDefinition:
        return parse_definition(self.yaml(), source=f"<{self.name}>")


async def _seed(dsn: str, workload: OneStep, inputs: list[dict[str, str]]) -> None:
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        store = Store(db)
        definition = workload.definition()
        await store.definitions.deploy(definition)
        for start in range(0, len(inputs), SUBMIT_CHUNK):
            await store.tasks.submit(definition, inputs[start : start + SUBMIT_CHUNK])
        async with db.connection() as conn:
            await conn.execute("ANALYZE")
    finally:
        await db.close()


def drain(server: str, variant: str, tasks: int, keys: int, concurrency: int) -> Drain:
    """Seed a fresh database with the variant's tasks and drain it with one worker."""
    workload = OneStep(keyed=variant != "plain")
    spread = tasks if variant == "distinct" else keys
    inputs = [{"account": f"acct-{index % spread}"} for index in range(tasks)]
    with scratch_database(server, f"bench_keys_{variant}") as dsn, tempfile.TemporaryDirectory(
        prefix="bench-keys-"
    ) as folder:
        anyio.run(_seed, dsn, workload, inputs)
        run = run_workers(dsn, write_definitions(Path(folder), [workload]), concurrency)
        states = task_states(dsn)
        if states != {"succeeded": tasks}:
            raise SystemExit(f"{variant}: the drain ended with {states}; reports {run.reports}")
    return Drain(variant, tasks, run.wall, run.cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=100, help="keys of the shared variant")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dsn", help="a server DSN (default: a temporary embedded server)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    rounds = []
    with bench_server(args.dsn) as server:
        for _ in range(args.rounds):
            rounds.append(
                {v: drain(server, v, args.tasks, args.keys, args.concurrency) for v in VARIANTS}
            )
    print(f"{args.tasks} one-step tasks, one worker at concurrency {args.concurrency}, "
          f"{args.rounds} rounds (shared: {args.keys} keys)")  # fmt: skip
    print(ratio_table(rounds, "task", "plain"))
    if args.json:
        args.json.write_text(json.dumps([{k: dataclasses.asdict(v) for k, v in r.items()}
                                         for r in rounds], indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
