"""What an emit costs, and how that grows with the tasks waiting for events.

For each W of ``--waiting`` (tasks waiting for ``thing.done``, each subscribed to its own
``ref``, made by SQL in one statement each), side by side in one invocation:

- ``miss``: an emit that matches no waiting task (one index probe per match shape);
- ``hit``: an emit that matches one waiting task, delivered and woken;
- ``trigger``: an emit whose trigger starts a task, against ``submit --key`` of the same
  task (``submit``), the floor of starting a task.

Columns: median milliseconds of each (``--emits`` emits per kind, wall time of the call in
this process), and the ratios to the smallest W (a cost independent of W stays near 1) and
trigger / submit. Nothing here asserts a timing.

Run: ``.venv/bin/python bench/events.py [--waiting 1000,100000] [--emits 200] [--dsn SERVER]``;
without ``--dsn`` a temporary embedded server is used.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio

from bench.workload import bench_server, scratch_database
from toolkit.definition import parse_definition
from toolkit.store import Database, Store
from toolkit.store.migrations import migrate

WAITING = parse_definition(
    """
name: bench-waiting
version: 1
input: {type: object}
start: wait
steps:
  wait: {wait: {event: thing.done, match: {ref: "${ input.ref }"}}}
""",
    source="<bench-waiting>",
)
STARTED = parse_definition(
    """
name: bench-started
version: 1
input: {type: object}
triggers:
  - {event: thing.started, key: "${ event.ref }"}
start: done
steps:
  done: {succeed: {}}
""",
    source="<bench-started>",
)

#: W waiting tasks, subscribed as their first cycle would subscribe them.
_PARK = """
WITH tasks AS (
    INSERT INTO toolkit_tasks (definition_name, definition_version, definition_digest, input,
                               checkpoint, state, wait_reason, run_at)
    SELECT 'bench-waiting', 1, %(digest)s, jsonb_build_object('ref', 'r-' || i),
           '{"cursor": "wait"}', 'waiting', 'signal', 'infinity'
    FROM generate_series(1, %(waiting)s) i
    RETURNING id, input
)
INSERT INTO toolkit_event_subscriptions (tenant, event, fields, match, task_id)
SELECT 'default', 'thing.done', '["ref"]', '["' || (input ->> 'ref') || '"]', id FROM tasks
"""


async def _timed(calls: int, call: object) -> float:
    """Median milliseconds of ``calls`` awaits of ``call(n)``."""
    times = []
    for n in range(calls):
        started = time.perf_counter()
        await call(n)  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def _round(dsn: str, waiting: int, emits: int) -> dict[str, float]:
    db = await Database.connect(dsn)
    try:
        await migrate(db)
        store = Store(db)
        await store.definitions.deploy(WAITING)
        await store.definitions.deploy(STARTED)
        async with db.connection() as conn:
            await conn.execute(_PARK, {"digest": WAITING.digest, "waiting": waiting})
            await conn.execute(
                "INSERT INTO toolkit_event_shapes VALUES ('thing.done', '[\"ref\"]')"
            )
            await conn.execute("ANALYZE")
        events = store.events
        miss = await _timed(emits, lambda n: events.emit("thing.done", {"ref": f"none-{n}"}))
        hit = await _timed(emits, lambda n: events.emit("thing.done", {"ref": f"r-{n + 1}"}))
        trigger = await _timed(emits, lambda n: events.emit("thing.started", {"ref": f"t-{n}"}))
        submit = await _timed(
            emits, lambda n: store.tasks.submit_keyed(STARTED, {}, key=f"bench-started:s-{n}")
        )
    finally:
        await db.close()
    return {"miss": miss, "hit": hit, "trigger": trigger, "submit": submit}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiting", default="1000,100000")
    parser.add_argument("--emits", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dsn", default=None, help="a server to use (default: embedded)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.waiting.split(",")]
    rounds: list[dict[int, dict[str, float]]] = []
    with bench_server(args.dsn) as server:
        for number in range(args.repeat):
            figures = {}
            for size in sizes:
                with scratch_database(server, "bench_events") as dsn:
                    figures[size] = anyio.run(_round, dsn, size, args.emits)
                print(f"round {number + 1}, W={size}: {figures[size]}", file=sys.stderr)
            rounds.append(figures)

    def median(size: int, key: str) -> float:
        return statistics.median(r[size][key] for r in rounds)

    first = sizes[0]
    print("| waiting tasks | miss ms | hit ms | trigger ms | submit ms | miss / W0 | hit / W0 "
          "| trigger / submit |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        ratio = statistics.median(r[size]["trigger"] / r[size]["submit"] for r in rounds)
        print(
            f"| {size:,} | {median(size, 'miss'):.2f} | {median(size, 'hit'):.2f} "
            f"| {median(size, 'trigger'):.2f} | {median(size, 'submit'):.2f} "
            f"| {median(size, 'miss') / median(first, 'miss'):.2f} "
            f"| {median(size, 'hit') / median(first, 'hit'):.2f} | {ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
