"""Peers side by side: runifold against plain Postgres queues on the same server (issue 22).

Each round, on fresh databases of one server, in turn (every other round in the reverse
order):

- ``runifold``: ``--jobs`` one-step no-op workflows (one idempotent no-op effect), drained
  by one worker process (``python -m toolkit run --until-idle``) at ``--concurrency``;
- ``pgqueuer``: ``--jobs`` no-op jobs drained by one PgQueuer worker with its defaults
  (batch size 10, ``mode=drain``);
- ``raw floor``: the same ``--jobs`` one-step tasks drained by ``bench/raw_floor.py`` in its
  ``unnest`` mode (the least SQL doing the engine's durable writes, batches of 32), as a
  process of its own at ``--concurrency`` connections, timed by its own drain (its process's
  start left out, unlike the others'): the target's other yardstick;
- ``procrastinate``: ``--jobs`` no-op jobs drained by one async Procrastinate worker at
  ``--concurrency`` (``wait=False``);
- ``dbos``: ``--jobs`` one-step DBOS workflows on a queue, drained by one DBOS process at
  ``--concurrency`` (``worker_concurrency``; the queue polled every 0.1 s);
- ``runifold 5-step`` and ``dbos 5-step``: ``--jobs``/5 five-step no-op workflows of each,
  at ``--five-concurrency``; ``runifold 5-step windowed`` the same with the worker's
  ``--checkpoint-window 0.5`` (the five outcomes of a cycle share its last write).

The peers are pinned in ``bench/peers/requirements.txt`` and installed into their own
virtualenv (``--venv``, made on first use; never the project's). Seeding is not timed; the
drain is timed from the worker's spawn to its exit, its CPU comes from ``wait4`` and the
server's CPU from its process tree (``/proc``, same machine only). Reported per system: the
median rate (jobs/s), worker and server CPU per job (ms) and the ratio of runifold's rate to
each peer's in the same round (median, min-max). All numbers are measurements; nothing here
asserts a timing, and CI does not run it.

Run: ``.venv/bin/python bench/peers/compare.py [--jobs 10000] [--rounds 3]
[--concurrency 32] [--five-concurrency 8] [--dsn SERVER_DSN] [--venv PATH]
[--systems runifold,pgqueuer,...]``; without ``--dsn`` a temporary embedded server is used.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.processes import WorkerProcess, run_workers
from bench.side_by_side import Drain, ratio_table
from bench.workload import (
    Workload,
    bench_server,
    scratch_database,
    seed,
    server_cpu,
    task_states,
    write_definitions,
)

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
DEFAULT_VENV = Path(tempfile.gettempdir()) / "runifold-bench-peers"
SYSTEMS = ("runifold", "pgqueuer", "raw floor", "procrastinate", "dbos", "runifold 5-step",
           "runifold 5-step windowed", "dbos 5-step")  # fmt: skip
RAW_FLOOR = HERE.parent / "raw_floor.py"
#: The worker options of ``runifold 5-step windowed``.
WINDOW = ("--checkpoint-window", "0.5")
#: What each system is compared with: the one-step runifold, or the five-step.
BASELINE = {
    "dbos 5-step": "runifold 5-step",
    "runifold 5-step": "runifold 5-step",
    "runifold 5-step windowed": "runifold 5-step",
}


def peers_python(venv: Path) -> Path:
    """The peers' interpreter, the virtualenv made or brought up to the pinned requirements.

    A marker file holds the requirements' digest: a changed pin reinstalls.
    """
    python = venv / "bin" / "python"
    marker = venv / "requirements.sha256"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and marker.exists() and marker.read_text() == digest:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True
    )
    marker.write_text(digest)
    return python


def _peer(python: Path, script: str, *args: str) -> list[str]:
    return [str(python), str(HERE / script), *args]


def _timed(
    dsn: str,
    command: Sequence[str],
    system: str,
    jobs: int,
    own_wall: Callable[[str], float] | None = None,
) -> Drain:
    """Run a peer's drain process to its exit; its wall (spawn to exit, or what ``own_wall``
    reads in its output), CPU and the server's CPU."""
    before = server_cpu(dsn)
    started = time.perf_counter()
    exited = WorkerProcess(command).reap()
    after = server_cpu(dsn)
    if exited.returncode != 0 or f"processed {jobs}" not in exited.stdout:
        raise SystemExit(f"{system} drain failed ({exited.returncode}):\n{exited.stdout}\n"
                         f"{exited.stderr}")  # fmt: skip
    wall = exited.ended - started if own_wall is None else own_wall(exited.stdout)
    spent = None if before is None or after is None else after - before
    return Drain(system, jobs, wall, exited.cpu, spent)


def drain_runifold(
    dsn: str, jobs: int, concurrency: int, _: Path, steps: int = 1, options: Sequence[str] = ()
) -> Drain:
    workload = Workload(steps, idempotent=True)
    seed(dsn, workload, jobs)
    with tempfile.TemporaryDirectory(prefix="peers-runifold-") as folder:
        definitions = write_definitions(Path(folder), [workload])
        before = server_cpu(dsn)
        run = run_workers(dsn, definitions, concurrency, options=options)
        after = server_cpu(dsn)
    if task_states(dsn) != {"succeeded": jobs}:
        raise SystemExit(f"runifold: the drain ended with {task_states(dsn)}")
    spent = None if before is None or after is None else after - before
    name = "runifold" if steps == 1 else f"runifold {steps}-step"
    name += " windowed" if options else ""
    return Drain(name, jobs, run.wall, run.cpu, spent)


def drain_raw_floor(dsn: str, jobs: int, concurrency: int) -> Drain:
    seed(dsn, Workload(1, idempotent=True), jobs)
    command = [sys.executable, str(RAW_FLOOR), "--seeded", dsn, "--steps", "1", "--mode",
               "unnest", "--concurrency", str(concurrency), "--batch", "32"]  # fmt: skip
    return _timed(dsn, command, "raw floor", jobs, own_wall=_floor_drain_seconds)


def _floor_drain_seconds(output: str) -> float:
    """The floor's drain alone, first thread started to last ended (its process's start, the
    interpreter and imports, left out: the harder yardstick, as in ``bench/throughput.py``)."""
    found = re.search(r"processed \d+ tasks in ([\d.]+) s", output)
    if found is None or float(found.group(1)) <= 0:
        raise SystemExit(f"raw floor: no drain time in its output:\n{output}")
    return float(found.group(1))


def drain_pgqueuer(dsn: str, jobs: int, _: int, python: Path) -> Drain:
    subprocess.run(_peer(python, "pgqueuer_peer.py", "seed", dsn, str(jobs)), check=True)
    return _timed(dsn, _peer(python, "pgqueuer_peer.py", "drain", dsn, str(jobs)), "pgqueuer",
                  jobs)  # fmt: skip


def drain_procrastinate(dsn: str, jobs: int, concurrency: int, python: Path) -> Drain:
    script = "procrastinate_peer.py"
    subprocess.run(_peer(python, script, "seed", dsn, str(jobs)), check=True,
                   capture_output=True)  # fmt: skip
    command = _peer(python, script, "drain", dsn, str(jobs), str(concurrency))
    return _timed(dsn, command, "procrastinate", jobs)


def drain_dbos(dsn: str, jobs: int, concurrency: int, python: Path, steps: int = 1) -> Drain:
    args = [dsn, str(jobs), str(steps), str(concurrency)]
    subprocess.run(_peer(python, "dbos_peer.py", "seed", *args), check=True,
                   capture_output=True)  # fmt: skip
    name = "dbos" if steps == 1 else f"dbos {steps}-step"
    return _timed(dsn, _peer(python, "dbos_peer.py", "drain", *args), name, jobs)


#: Each system's drain: (database, jobs, concurrency, peers' python, five-step concurrency).
DRAINS: dict[str, Callable[[str, int, int, Path, int], Drain]] = {
    "runifold": lambda dsn, jobs, c, python, _: drain_runifold(dsn, jobs, c, python),
    "pgqueuer": lambda dsn, jobs, c, python, _: drain_pgqueuer(dsn, jobs, c, python),
    "raw floor": lambda dsn, jobs, c, _, __: drain_raw_floor(dsn, jobs, c),
    "procrastinate": lambda dsn, jobs, c, python, _: drain_procrastinate(dsn, jobs, c, python),
    "dbos": lambda dsn, jobs, c, python, _: drain_dbos(dsn, jobs, c, python),
    "runifold 5-step": lambda dsn, jobs, _, python, c5: drain_runifold(
        dsn, jobs // 5, c5, python, steps=5
    ),
    "runifold 5-step windowed": lambda dsn, jobs, _, python, c5: drain_runifold(
        dsn, jobs // 5, c5, python, steps=5, options=WINDOW
    ),
    "dbos 5-step": lambda dsn, jobs, _, python, c5: drain_dbos(dsn, jobs // 5, c5, python, 5),
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--five-concurrency", type=int, default=8)
    parser.add_argument("--dsn", help="a server DSN (default: a temporary embedded server)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the peers' virtualenv")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="the systems to run, comma-separated (default: all; a ratio needs its baseline)",
    )
    args = parser.parse_args(argv)
    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}: choose among {', '.join(SYSTEMS)}")
    for name in systems:
        if BASELINE.get(name, "runifold") not in systems:
            parser.error(f"{name!r} is compared with {BASELINE.get(name, 'runifold')!r}: run both")
    python = peers_python(args.venv)
    rounds = []
    with bench_server(args.dsn) as server:
        for n in range(args.rounds):
            drains = {}
            order = [name for name in SYSTEMS if name in systems]
            # every other round in the reverse order: no system always runs first or last
            for system in order[::-1] if n % 2 else order:
                name = f"bench_peer_{system.replace(' ', '_').replace('-', '_')}"
                with scratch_database(server, name) as dsn:
                    drains[system] = DRAINS[system](
                        dsn, args.jobs, args.concurrency, python, args.five_concurrency
                    )
            rounds.append({system: drains[system] for system in order})
            print(f"round {n + 1}: " + ", ".join(
                f"{s} {d.rate:,.0f}/s" for s, d in drains.items()), flush=True)  # fmt: skip
    print(f"{args.jobs} no-op jobs (runifold, DBOS: one-step workflows) and {args.jobs // 5} "
          f"five-step workflows, one worker process each, concurrency {args.concurrency} "
          f"(five-step: {args.five_concurrency}; PgQueuer: its default batch of 10), "
          f"{args.rounds} rounds; jobs/s counts workflows")  # fmt: skip
    print(ratio_table(rounds, "job", lambda name: BASELINE.get(name, "runifold"),
                      baseline_over=True))  # fmt: skip
    if {"runifold 5-step windowed", "dbos 5-step"} <= set(systems):
        five = [{name: r[name] for name in ("runifold 5-step windowed", "dbos 5-step")}
                for r in rounds]  # fmt: skip
        print("\nfive-step with the checkpoint window, against DBOS in the same rounds:")
        print(ratio_table(five, "job", "runifold 5-step windowed", baseline_over=True))


if __name__ == "__main__":
    main()
