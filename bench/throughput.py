"""Throughput of the engine against the raw SQL floor, on no-op workflows.

Scenarios (N = ``--tasks``):

- A: N one-step workflows of one idempotent no-op effect → workflows/s.
- B: N/5 five-step workflows of idempotent no-op effects → steps/s.
- C: N/5 five-step workflows of non-idempotent no-op effects (intent before every call).

For each scenario, first the raw floor (``bench/raw_floor.py``) runs the same tasks in every
mode; then ONE worker subprocess (``python -m toolkit run --until-idle``, the production
process tree) drains them, timed from its spawn to its exit. Every run gets a freshly
created, migrated and seeded database; the best of ``--repeat`` runs is kept (the machine
may be shared). The worker's CPU time and peak RSS come from ``wait4(2)``, commits and rows
per task from ``pg_stat_database``, bytes per task from ``pg_total_relation_size`` of the
task tables after the run (and after ``VACUUM FULL``).

Run: ``.venv/bin/python bench/throughput.py [--tasks N] [--concurrency C] [--dsn DSN]
[--json PATH] [--profile DIR]``; without ``--dsn`` a temporary embedded server is used.
All numbers are measurements; nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.raw_floor import FLOOR_MODES, MODES, FloorResult, Mode, run_floor
from bench.workload import (
    Counters,
    Workload,
    bench_server,
    counters,
    scratch_database,
    seed,
    stored_bytes,
    task_states,
)

REPO = Path(__file__).resolve().parents[1]
APP = "bench.noop_app"
#: The floor modes that, like the engine, commit every task-write on its own.
PER_WRITE_MODES: tuple[Mode, ...] = ("commit-per-write", "engine-sql")
_REPORT = re.compile(
    r"succeeded (?P<succeeded>\d+),.*max loop lag (?P<lag>\d+) ms, wall (?P<wall>[\d.]+) s"
)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A workload and how many of the ``--tasks`` it runs (``tasks // divisor``)."""

    key: str
    title: str
    workload: Workload
    divisor: int

    def tasks(self, total: int) -> int:
        return max(1, total // self.divisor)


SCENARIOS = (
    Scenario("A", "1-step idempotent", Workload(1, idempotent=True), 1),
    Scenario("B", "5-step idempotent", Workload(5, idempotent=True), 5),
    Scenario("C", "5-step non-idempotent", Workload(5, idempotent=False), 5),
)


@dataclasses.dataclass(frozen=True)
class WorkerRun:
    """One worker subprocess, from spawn to exit."""

    wall: float
    cpu: float
    peak_rss: int
    supervisor_wall: float
    succeeded: int
    max_loop_lag_ms: int
    report: str


@dataclasses.dataclass(frozen=True)
class Row:
    """Everything measured for one scenario (the first nine fields are the printed table)."""

    scenario: str
    tasks: int
    steps: int
    wall_s: float
    workflows_per_s: float
    steps_per_s: float
    floor_steps_per_s: float
    engine_over_floor: float
    worker_peak_rss_mb: float
    floor_mode: str
    floor_by_mode: dict[str, float]
    supervisor_wall_s: float
    worker_cpu_s: float
    worker_cpu_us_per_step: float
    max_loop_lag_ms: int
    commits_per_task: float
    rows_inserted_per_task: float
    rows_updated_per_task: float
    floor_commits_per_task: dict[str, float]
    bytes_per_task: float
    bytes_per_task_live: float
    live_bytes_per_task_by_table: dict[str, float]
    floor_bytes_per_task_live: float
    startup_wall_s: float
    startup_cpu_s: float
    profile: str | None

    @property
    def cpu_us_per_step_after_startup(self) -> float:
        return (self.worker_cpu_s - self.startup_cpu_s) / self.steps * 1e6


# --- the floor --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FloorMeasure:
    """The best floor run of one mode, its commits and live table bytes per task."""

    result: FloorResult
    commits_per_task: float
    live_bytes_per_task: float


def measure_floor(
    server: str, scenario: Scenario, tasks: int, *, concurrency: int, batch: int, repeat: int
) -> dict[Mode, FloorMeasure]:
    """Best of ``repeat`` floor runs per mode, each in a freshly seeded database."""
    best: dict[Mode, FloorMeasure] = {}
    for mode in MODES:
        for _ in range(repeat):
            with scratch_database(server, f"bench_{scenario.key.lower()}_floor") as dsn:
                seed(dsn, scenario.workload, tasks)
                before = counters(dsn)
                result = run_floor(
                    dsn, scenario.workload, concurrency=concurrency, batch=batch, mode=mode
                )
                commits = (counters(dsn) - before).commits
                _check_finished(dsn, tasks, f"floor {mode}")
                size = sum(stored_bytes(dsn, compact=True).values())
            if mode not in best or result.wall < best[mode].result.wall:
                best[mode] = FloorMeasure(result, commits / tasks, size / tasks)
    return best


def _check_finished(dsn: str, tasks: int, what: str) -> None:
    states = task_states(dsn)
    if states != {"succeeded": tasks}:
        raise RuntimeError(f"{what}: expected {tasks} succeeded tasks, found {states}")


# --- the engine -------------------------------------------------------------------------------


def worker_command(dsn: str, definitions: Path, concurrency: int) -> list[str]:
    """The production worker: ``python -m toolkit run`` until the queue drains."""
    return [
        sys.executable, "-m", "toolkit", "--dsn", dsn, "run", "--app", APP,
        "--definitions", str(definitions), "--concurrency", str(concurrency), "--until-idle",
    ]  # fmt: skip


def run_worker(
    dsn: str, definitions: Path, concurrency: int, profile: Path | None = None
) -> WorkerRun:
    """Spawn one worker, wait for it with ``wait4`` and parse its report line.

    With ``profile``, py-spy attaches to the worker by pid (the measured process tree stays
    the production one) and writes collapsed stacks there.
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    py_spy = None if profile is None else _find_py_spy()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            worker_command(dsn, definitions, concurrency), cwd=REPO, env=env, stdout=out, stderr=err
        )
        spy = None
        if py_spy is not None and profile is not None:
            profile.parent.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                [py_spy, "record", "--pid", str(proc.pid), "--rate", "250", "--idle",
                 "--format", "raw", "--output", str(profile)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if spy is not None:
            spy.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    match = _REPORT.search(stdout)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"worker exited {proc.returncode}:\n{stdout}\n{stderr}")
    return WorkerRun(
        wall=wall,
        cpu=usage.ru_utime + usage.ru_stime,
        peak_rss=usage.ru_maxrss * 1024,  # kilobytes on Linux: the VmHWM at exit
        supervisor_wall=float(match["wall"]),
        succeeded=int(match["succeeded"]),
        max_loop_lag_ms=int(match["lag"]),
        report=stdout.strip(),
    )


def _find_py_spy() -> str:
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise RuntimeError("--profile needs py-spy (e.g. `.venv/bin/pip install py-spy`)")
    return py_spy


@dataclasses.dataclass(frozen=True)
class EngineMeasure:
    """The worker run with the database's counters and sizes around it."""

    run: WorkerRun
    delta: Counters
    bytes_after: dict[str, int]
    bytes_live: dict[str, int]


def measure_engine(
    server: str, scenario: Scenario, tasks: int, *, concurrency: int, profile: Path | None
) -> EngineMeasure:
    """Seed ``tasks`` tasks in a fresh database and drain them with one worker process."""
    with (
        scratch_database(server, f"bench_{scenario.key.lower()}_engine_{tasks}") as dsn,
        tempfile.TemporaryDirectory(prefix="runifold-bench-") as folder,
    ):
        definitions = Path(folder) / f"{scenario.workload.name}.yaml"
        definitions.write_text(scenario.workload.yaml(), encoding="utf-8")
        seed(dsn, scenario.workload, tasks)
        before = counters(dsn)
        run = run_worker(dsn, definitions, concurrency, profile)
        delta = counters(dsn) - before
        if tasks:
            _check_finished(dsn, tasks, "engine")
        return EngineMeasure(run, delta, stored_bytes(dsn), stored_bytes(dsn, compact=True))


# --- one scenario -----------------------------------------------------------------------------


def measure_startup(server: str, concurrency: int) -> WorkerRun:
    """A worker on an empty queue: interpreter start, imports, pool, register, exit."""
    return measure_engine(server, SCENARIOS[0], 0, concurrency=concurrency, profile=None).run


def measure(scenario: Scenario, server: str, startup: WorkerRun, args: argparse.Namespace) -> Row:
    tasks = scenario.tasks(args.tasks)
    steps = tasks * scenario.workload.steps
    floors = measure_floor(
        server, scenario, tasks,
        concurrency=args.concurrency, batch=args.floor_batch, repeat=args.repeat,
    )  # fmt: skip
    engine = min(
        (
            measure_engine(server, scenario, tasks, concurrency=args.concurrency, profile=None)
            for _ in range(args.repeat)
        ),
        key=lambda measured: measured.run.wall,
    )
    profile = None
    if args.profile is not None:  # one more run, sampled, kept out of the numbers
        profile = args.profile / f"worker-{scenario.key}.txt"
        measure_engine(server, scenario, tasks, concurrency=args.concurrency, profile=profile)
    best_mode = min(FLOOR_MODES, key=lambda mode: floors[mode].result.wall)
    floor = floors[best_mode].result.steps_per_second
    run = engine.run
    return Row(
        scenario=f"{scenario.key}: {scenario.title}",
        tasks=tasks,
        steps=steps,
        wall_s=run.wall,
        workflows_per_s=tasks / run.wall,
        steps_per_s=steps / run.wall,
        floor_steps_per_s=floor,
        engine_over_floor=steps / run.wall / floor,
        worker_peak_rss_mb=run.peak_rss / 2**20,
        floor_mode=best_mode,
        floor_by_mode={m: f.result.steps_per_second for m, f in floors.items()},
        supervisor_wall_s=run.supervisor_wall,
        worker_cpu_s=run.cpu,
        worker_cpu_us_per_step=run.cpu / steps * 1e6,
        max_loop_lag_ms=run.max_loop_lag_ms,
        commits_per_task=engine.delta.commits / tasks,
        rows_inserted_per_task=engine.delta.inserted / tasks,
        rows_updated_per_task=engine.delta.updated / tasks,
        floor_commits_per_task={m: f.commits_per_task for m, f in floors.items()},
        bytes_per_task=sum(engine.bytes_after.values()) / tasks,
        bytes_per_task_live=sum(engine.bytes_live.values()) / tasks,
        live_bytes_per_task_by_table={t: b / tasks for t, b in engine.bytes_live.items()},
        floor_bytes_per_task_live=floors[best_mode].live_bytes_per_task,
        startup_wall_s=startup.wall,
        startup_cpu_s=startup.cpu,
        profile=None if profile is None else str(profile),
    )


# --- output -----------------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * width for width in widths], *rows]
    return "\n".join(
        "  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in
                  enumerate(zip(line, widths, strict=True)))
        for line in lines
    )  # fmt: skip


def main_table(rows: Sequence[Row]) -> str:
    headers = [
        "scenario", "tasks", "steps", "wall s", "workflows/s", "steps/s", "floor steps/s",
        "engine/floor", "worker peak RSS MB",
    ]  # fmt: skip
    return _table(headers, [
        [r.scenario, str(r.tasks), str(r.steps), f"{r.wall_s:.2f}", f"{r.workflows_per_s:,.0f}",
         f"{r.steps_per_s:,.0f}", f"{r.floor_steps_per_s:,.0f} ({r.floor_mode})",
         f"{r.engine_over_floor:.3f}", f"{r.worker_peak_rss_mb:.1f}"]
        for r in rows
    ])  # fmt: skip


def time_table(rows: Sequence[Row]) -> str:
    """Every floor mode, and the engine's run (process start excluded) and CPU."""
    headers = [
        "scenario", *(f"{m}/s" for m in MODES), "engine run/s", "run s", "worker CPU s",
        "CPU us/step -startup", "run/commit-per-write", "run/engine-sql",
    ]  # fmt: skip
    table = []
    for r in rows:
        run = r.steps / r.supervisor_wall_s
        table.append([
            r.scenario.split(":")[0], *(f"{r.floor_by_mode[m]:,.0f}" for m in MODES),
            f"{run:,.0f}", f"{r.supervisor_wall_s:.2f}", f"{r.worker_cpu_s:.2f}",
            f"{r.cpu_us_per_step_after_startup:.0f}",
            f"{run / r.floor_by_mode['commit-per-write']:.2f}",
            f"{run / r.floor_by_mode['engine-sql']:.2f}",
        ])  # fmt: skip
    return _table(headers, table)


def storage_table(rows: Sequence[Row]) -> str:
    """Commits, rows and bytes per task: engine against floor."""
    headers = [
        "scenario", "commits/task", *(f"{m} commits/task" for m in PER_WRITE_MODES),
        "rows ins+upd/task", "bytes/task", "live bytes/task", "live by table",
        "floor live bytes/task",
    ]  # fmt: skip
    return _table(headers, [
        [r.scenario.split(":")[0], f"{r.commits_per_task:.2f}",
         *(f"{r.floor_commits_per_task[m]:.2f}" for m in PER_WRITE_MODES),
         f"{r.rows_inserted_per_task:.1f}+{r.rows_updated_per_task:.1f}",
         f"{r.bytes_per_task:,.0f}", f"{r.bytes_per_task_live:,.0f}",
         "+".join(f"{b:,.0f}" for b in r.live_bytes_per_task_by_table.values()),
         f"{r.floor_bytes_per_task_live:,.0f}"]
        for r in rows
    ])  # fmt: skip


def top_frames(collapsed: Path, limit: int = 15) -> str:
    """Summarise py-spy collapsed stacks: samples by leaf frame (self), by frame (total) and
    by the package of the leaf frame."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_split_frame(frame) for frame in stack.split(";") if frame]
        leaf = frames[-1] if frames else ("<no frame>", "<no frame>")
        n = int(count)
        samples += n
        own[_frame_name(*leaf)] += n
        packages[_package(leaf[1])] += n
        for frame in {_frame_name(*frame) for frame in frames}:
            total[frame] += n
    lines = [f"{samples} samples (idle included: waiting on the database shows as select)"]
    for title, counter in (("self", own), ("total", total), ("package (self)", packages)):
        lines.append(f"top {limit} by {title}:")
        lines += [f"  {100 * n / samples:5.1f}%  {name}" for name, n in counter.most_common(limit)]
    return "\n".join(lines)


def _split_frame(frame: str) -> tuple[str, str]:
    """``func (package/module.py:12)`` → ``("func", "package/module.py")``."""
    name, _, where = frame.partition(" (")
    return name, where.rstrip(")").rsplit(":", 1)[0]


def _frame_name(name: str, path: str) -> str:
    return f"{name} ({path})"


def _package(path: str) -> str:
    if path.startswith("<frozen"):
        return "<imports>"
    return path.split("/", 1)[0].removesuffix(".py")


# --- main -------------------------------------------------------------------------------------


def _code_version() -> str:
    """``git describe`` of the measured tree (``-dirty`` when files are modified)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or "unknown"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="N (default 2000)")
    parser.add_argument("--concurrency", type=int, default=8, help="worker concurrency (8)")
    parser.add_argument("--dsn", help="server DSN (default: a temporary embedded server)")
    parser.add_argument("--home", help="embedded server home to reuse (left running)")
    parser.add_argument("--scenarios", default="ABC", help="which scenarios (default ABC)")
    parser.add_argument("--floor-batch", type=int, default=32, help="floor claim batch (32)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of the worker and of each floor mode (3)"
    )
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    parser.add_argument(
        "--profile", type=Path, help="one extra worker run per scenario under py-spy (folder)"
    )
    return parser.parse_args(argv)


def run_scenarios(args: argparse.Namespace) -> Iterator[Row]:
    chosen = [s for s in SCENARIOS if s.key in args.scenarios.upper()]
    with bench_server(args.dsn, args.home) as server:
        startup = measure_startup(server, args.concurrency)
        for scenario in chosen:
            row = measure(scenario, server, startup, args)
            print(f"{row.scenario}: {row.steps_per_s:,.0f} steps/s", file=sys.stderr, flush=True)
            yield row


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    rows = list(run_scenarios(args))
    where = args.dsn or "embedded server"
    print(
        f"runifold throughput: {where}, concurrency {args.concurrency}, no-op effects, "
        f"code {_code_version()}"
    )
    print(main_table(rows))
    print(
        "(engine/floor = engine steps/s over the best floor mode's; engine wall = worker spawn "
        "to exit)\n"
    )
    print(time_table(rows))
    print(
        "(engine run/s: steps over the supervisor's own wall time, process start and exit "
        "excluded; engine-sql: the engine's SQL and parameters without its Python)\n"
    )
    print(storage_table(rows))
    if rows:
        print(
            f"(worker startup and exit on an empty queue: {rows[0].startup_wall_s:.2f} s wall, "
            f"{rows[0].startup_cpu_s:.2f} s CPU; included in 'wall s'); live by table: "
            + " + ".join(rows[0].live_bytes_per_task_by_table)
        )
    for row in rows:
        if row.profile is not None:
            print(f"\nworker profile, {row.scenario} ({row.profile}):")
            print(top_frames(Path(row.profile)))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
