"""Tags and filters at scale: what a tag filter costs at 100,000 and 1,000,000 tasks.

For each size, a scratch database gets that many ended tasks (two definitions, 1,000
customers as tags, one task in 10,000 tagged ``customer=rare``) plus a few hundred failed
ones, then VACUUM (ANALYZE). Side by side, in one run, each repeated ``--repeat`` times and
interleaved:

- ``tag count``: ``toolkit tasks --tag customer=c17 --count`` (1,000 matches at 1 M), the
  store's own statement, against the same statement with index scans turned off (a
  sequential scan): the ratio is what the GIN index buys;
- ``tag page``: the first page of 100 of that filter (``ORDER BY id DESC LIMIT 100``);
- ``rare tag``: the page of ``customer=rare``;
- ``state + definition``: ``--state failed --definition refunds@1`` (300 matches).

Then the submit cost of tags: 2,000 tasks submitted with three tags each against 2,000
without (the GIN index's upkeep on insert), as a ratio.

Run: ``.venv/bin/python bench/tags.py [--sizes 100000,1000000] [--repeat 5] [--dsn SERVER]``;
without ``--dsn`` a temporary embedded server is used. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, LiteralString

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import psycopg

from bench.workload import bench_server, scratch_database
from toolkit.definition import parse_definition
from toolkit.store import Store
from toolkit.store.filters import TaskFilter
from toolkit.store.queries import query

_FILL: LiteralString = """
INSERT INTO toolkit_tasks
    (definition_name, definition_version, definition_digest, input, checkpoint, state, tags,
     finished_at)
SELECT CASE WHEN i %% 2 = 0 THEN 'orders' ELSE 'billing' END, 1, 'd', '{}'::jsonb,
       '{}'::jsonb, 'succeeded',
       CASE WHEN i %% 10000 = 0 THEN '{"customer": "rare", "region": "eu"}'::jsonb
            ELSE jsonb_build_object('customer', 'c' || (i %% 1000), 'region',
                                    CASE WHEN i %% 3 = 0 THEN 'us' ELSE 'eu' END) END,
       now()
FROM generate_series(1, %(n)s) i
UNION ALL
SELECT 'refunds', 1, 'd', '{}'::jsonb, '{}'::jsonb, 'failed', '{}'::jsonb, now()
FROM generate_series(1, 300) i
"""

DEFINITION = parse_definition(
    """
name: submitted
version: 1
input: {type: object}
start: done
steps:
  done: {succeed: {output: ok}}
""",
    source="<bench-tags>",
)

#: The filters timed, by label.
FILTERS: dict[str, tuple[str, TaskFilter]] = {
    "tag count": ("count_tasks", TaskFilter(tags={"customer": "c17"})),
    "tag page": ("list_tasks", TaskFilter(tags={"customer": "c17"})),
    "rare tag": ("list_tasks", TaskFilter(tags={"customer": "rare"})),
    "state + definition": ("count_tasks", TaskFilter(state="failed", definition="refunds@1")),
}


def _timed(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> float:
    """Seconds one run of a named query takes, unprepared (as the store runs a filter)."""
    started = time.perf_counter()
    conn.execute(query(name), params, prepare=False).fetchall()
    return time.perf_counter() - started


def _filters(dsn: str, repeat: int) -> dict[str, tuple[float, float]]:
    """Median seconds of each filter, with its indexes and with a sequential scan."""
    import datetime

    now = datetime.datetime.now(datetime.UTC)
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in FILTERS}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(repeat):
            for label, (name, where) in FILTERS.items():
                params = {**where.params(now), "before": None, "limit": 100}
                indexed, scanned = times[label]
                indexed.append(_timed(conn, name, params))
                conn.execute("SET enable_indexscan = off")
                conn.execute("SET enable_bitmapscan = off")
                scanned.append(_timed(conn, name, params))
                conn.execute("RESET enable_indexscan")
                conn.execute("RESET enable_bitmapscan")
    return {k: (statistics.median(a), statistics.median(b)) for k, (a, b) in times.items()}


async def _submit_cost(dsn: str, tasks: int, repeat: int) -> tuple[float, float]:
    """Median seconds to submit ``tasks`` tasks with three tags and with none."""
    tagged, plain = [], []
    async with await Store.open(dsn) as store:
        await store.definitions.deploy(DEFINITION)
        tags = {"customer": "acme", "region": "eu", "channel": "web"}
        runs: list[tuple[list[float], dict[str, str] | None]] = [(tagged, tags), (plain, None)]
        for index in range(repeat):
            for found, given in runs if index % 2 == 0 else runs[::-1]:  # alternate the order
                started = time.perf_counter()
                for start in range(0, tasks, 500):
                    await store.tasks.submit(DEFINITION, [{}] * min(500, tasks - start), tags=given)
                found.append(time.perf_counter() - started)
    return statistics.median(tagged), statistics.median(plain)


def run(server: str, size: int, repeat: int, submits: int) -> dict[str, Any]:
    """One size: fill a scratch database, time the filters and the submits."""
    with scratch_database(server, f"bench_tags_{size}") as dsn:
        anyio.run(_migrate, dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_FILL, {"n": size})
            conn.execute("VACUUM (ANALYZE) toolkit_tasks")
        filters = _filters(dsn, repeat)
        tagged, plain = anyio.run(_submit_cost, dsn, submits, repeat)
    return {
        "size": size,
        "filters": {
            label: {"indexed_ms": indexed * 1e3, "scan_ms": scanned * 1e3}
            for label, (indexed, scanned) in filters.items()
        },
        "submit_tagged_ms": tagged * 1e3,
        "submit_plain_ms": plain * 1e3,
    }


async def _migrate(dsn: str) -> None:
    async with await Store.open(dsn):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="100000,1000000", help="task counts (100000,1000000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measurement (5)")
    parser.add_argument("--submits", type=int, default=2000, help="tasks a submit run (2000)")
    parser.add_argument("--dsn", help="server DSN (default: a temporary embedded server)")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args()
    sizes = [int(text) for text in args.sizes.split(",")]
    with bench_server(args.dsn) as server:
        rows = [run(server, size, args.repeat, args.submits) for size in sizes]
    print(f"{'tasks':>10}  {'filter':<20} {'indexed ms':>11} {'scan ms':>9} {'index/scan':>10}")
    for row in rows:
        for label, t in row["filters"].items():
            ratio = t["indexed_ms"] / t["scan_ms"]
            print(f"{row['size']:>10,}  {label:<20} {t['indexed_ms']:>11.2f} {t['scan_ms']:>9.1f}"
                  f" {ratio:>10.4f}")  # fmt: skip
    for row in rows:
        ratio = row["submit_tagged_ms"] / row["submit_plain_ms"]
        print(f"{row['size']:>10,}  submit {args.submits} tasks: with 3 tags "
              f"{row['submit_tagged_ms']:.0f} ms, without {row['submit_plain_ms']:.0f} ms, "
              f"ratio {ratio:.2f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
