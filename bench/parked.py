"""Parked work: does an idle worker slow down with many tasks queued but not yet due?

On fresh databases of one server, ``--small`` and then ``--large`` tasks are parked on a
one-hour timer (``waiting``, reason ``timer``): the first 1,000 by a worker, as production
parks them, the rest copies of their rows (:func:`bench.processes.park_timers`). On each:

- the idle path's statements are timed from a client (``idle_state`` and an empty
  ``claim_tasks``, :func:`bench.latency.probe_statements`);
- one worker is started, left idle on LISTEN/NOTIFY, and ``--submits`` one-step tasks are
  submitted ``--interval-ms`` apart: submit → claim, from the task events (database time).

Interleaved over ``--rounds`` rounds; issue 20's target is each figure with ``--large``
parked at most 2x its value with ``--small``, in the same round.

Run: ``.venv/bin/python bench/parked.py [--small 1000] [--large 1000000] [--rounds 2]
[--submits 200] [--interval-ms 20] [--dsn SERVER_DSN] [--json PATH]``; without ``--dsn`` a
temporary embedded server is used. All numbers are measurements; nothing here asserts a
timing (``tests/store/test_query_plan.py`` checks the idle path's plans).
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

from bench.latency import IdleLatency, StatementProbe, idle_latency_on, probe_statements
from bench.processes import park_timers
from bench.workload import TIMER, Workload, bench_server, scratch_database

WORKLOAD = Workload(1, idempotent=True)
#: Timers parked by a worker; the rest are copies of their rows.
PARKED_BY_WORKER = 1_000


@dataclasses.dataclass(frozen=True)
class Measured:
    """The idle path with ``parked`` timers: its statements, and submit → claim."""

    parked: int
    probe: StatementProbe
    latency: IdleLatency


def measure(server: str, parked: int, submits: int, interval: float) -> Measured:
    """Park ``parked`` timers on a fresh database, probe the idle path, time idle submits."""
    with (
        scratch_database(server, "bench_parked") as dsn,
        tempfile.TemporaryDirectory(prefix="bench-parked-") as folder,
    ):
        park_timers(dsn, Path(folder) / "park", parked, by_worker=PARKED_BY_WORKER)
        digests = [TIMER.definition().digest, WORKLOAD.definition().digest]
        probe = probe_statements(dsn, digests, samples=100)
        latency = idle_latency_on(
            dsn, Path(folder) / "run", WORKLOAD, submits=submits, interval=interval,
            concurrency=32, waiting=parked,
        )  # fmt: skip
    return Measured(parked, probe, latency)


def _row(name: str, small: list[float], large: list[float]) -> str:
    ratios = [b / a for a, b in zip(small, large, strict=True)]
    return (
        f"| {name} | {statistics.median(small):.2f} | {statistics.median(large):.2f} "
        f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--submits", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--dsn", help="a server DSN (default: a temporary embedded server)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    rounds: list[tuple[Measured, Measured]] = []
    with bench_server(args.dsn) as server:
        for _ in range(args.rounds):
            rounds.append((
                measure(server, args.small, args.submits, args.interval_ms / 1000),
                measure(server, args.large, args.submits, args.interval_ms / 1000),
            ))  # fmt: skip
    small, large = [r[0] for r in rounds], [r[1] for r in rounds]
    print(f"{args.submits} idle submits {args.interval_ms:g} ms apart, one worker; "
          f"{args.rounds} rounds, medians (ratio: same round, min-max)\n")  # fmt: skip
    print(f"| ms | {args.small:,} parked | {args.large:,} parked | ratio |")
    print("| --- | --- | --- | --- |")
    for name, pick in (
        ("idle_state p50", lambda m: m.probe.idle_state.p50),
        ("idle_state p99", lambda m: m.probe.idle_state.p99),
        ("empty claim_tasks p50", lambda m: m.probe.claim.p50),
        ("submit → claim p50", lambda m: m.latency.to_claimed.p50),
        ("submit → claim p99", lambda m: m.latency.to_claimed.p99),
    ):
        print(_row(name, [pick(m) for m in small], [pick(m) for m in large]))
    if args.json:
        args.json.write_text(json.dumps([[dataclasses.asdict(m) for m in r] for r in rounds],
                                        indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
