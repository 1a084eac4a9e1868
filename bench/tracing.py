"""Tracing: what the OpenTelemetry instrumentation costs a drain, side by side in one run.

One worker process (``python -m toolkit run --until-idle``, concurrency ``--concurrency``)
drains ``--tasks`` five-step no-op workflows three ways, interleaved over ``--rounds`` rounds
on fresh databases of one server:

- ``absent``: the ``opentelemetry`` packages made unimportable (a ``sitecustomize`` import
  hook): the worker of a user without the ``otel`` extra;
- ``api``: the API installed, no tracer provider configured (non-recording spans);
- ``recording``: the SDK configured with a batch span processor and an exporter that drops
  everything (``bench/traced_app.py``): every span recorded, one ``trace_attempt`` write per
  cycle.

Reported per variant: the median rate (workflows/s from spawn to exit), worker CPU per
workflow (ms) and the ratio of each rate to ``absent`` in the same round (median over
rounds). All numbers are measurements; nothing here asserts a timing.

Run: ``.venv/bin/python bench/tracing.py [--tasks 2000] [--rounds 3] [--concurrency 32]
[--dsn SERVER_DSN]``; without ``--dsn`` a temporary embedded server is used.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio

from bench.noop_app import NOOP_HANDLER
from bench.processes import APP, run_workers
from bench.side_by_side import Drain, ratio_table
from bench.workload import SUBMIT_CHUNK, bench_server, scratch_database, task_states
from toolkit.definition import parse_definition
from toolkit.store import Store
from toolkit.store.database import Database
from toolkit.store.migrations import migrate

VARIANTS = ("absent", "api", "recording")
STEPS = 5
FIVE_STEPS = (
    "name: bench-traced\nversion: 1\ninput: {type: object}\nstart: s1\nsteps:\n"
    + "".join(
        f"  s{n}: {{effect: {NOOP_HANDLER}, idempotent: true"
        + (f", next: s{n + 1}}}\n" if n < STEPS else "}\n")
        for n in range(1, STEPS + 1)
    )
)
UNIMPORTABLE = """
import sys

class _Unimportable:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _Unimportable())
"""


async def _seed(dsn: str, tasks: int) -> None:
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        store = Store(db)
        definition = parse_definition(FIVE_STEPS, source="<bench-traced>")
        await store.definitions.deploy(definition)
        for start in range(0, tasks, SUBMIT_CHUNK):
            await store.tasks.submit(definition, [{}] * min(SUBMIT_CHUNK, tasks - start))
        async with db.connection() as conn:
            await conn.execute("ANALYZE")
    finally:
        await db.close()


def drain(server: str, variant: str, tasks: int, concurrency: int, hook: Path) -> Drain:
    """Seed a fresh database and drain it with one worker of ``variant``."""
    app = "bench.traced_app" if variant == "recording" else APP
    env: Mapping[str, str] = {"PYTHONPATH": str(hook)} if variant == "absent" else {}
    with scratch_database(server, f"bench_trace_{variant}") as dsn, tempfile.TemporaryDirectory(
        prefix="bench-trace-"
    ) as folder:
        anyio.run(_seed, dsn, tasks)
        (Path(folder) / "bench-traced.yaml").write_text(FIVE_STEPS)
        run = run_workers(dsn, Path(folder), concurrency, app=app, env=env)
        states = task_states(dsn)
        if states != {"succeeded": tasks}:
            raise SystemExit(f"{variant}: the drain ended with {states}; reports {run.reports}")
    return Drain(variant, tasks, run.wall, run.cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--dsn", help="a server DSN (default: a temporary embedded server)")
    args = parser.parse_args(argv)
    rounds = []
    with bench_server(args.dsn) as server, tempfile.TemporaryDirectory() as hook:
        (Path(hook) / "sitecustomize.py").write_text(UNIMPORTABLE)
        for _ in range(args.rounds):
            rounds.append(
                {v: drain(server, v, args.tasks, args.concurrency, Path(hook)) for v in VARIANTS}
            )
    print(ratio_table(rounds, "workflow", "absent"))
    print(f"{args.tasks} five-step no-op workflows, one worker at concurrency "
          f"{args.concurrency}, {args.rounds} rounds")  # fmt: skip


if __name__ == "__main__":
    main()
