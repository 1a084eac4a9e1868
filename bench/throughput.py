"""Throughput and latency of the engine against the raw SQL floor, on no-op workflows.

Scenarios (N = ``--tasks``, T = ``--target-tasks``, W = ``--waiting``, C = ``--concurrency``):

- A: N one-step workflows of one idempotent no-op effect → workflows/s.
- B: N/5 five-step workflows of idempotent no-op effects → steps/s.
- C: N/5 five-step workflows of non-idempotent no-op effects (intent before every call).
- A32: the target setting: T one-step workflows, one worker process at concurrency 32.
- A32T: A32 with W more tasks parked on a one-hour timer (``wait: {duration: 1h}``) by a
  worker beforehand (then ``VACUUM (ANALYZE)``); the worker loads both definitions.
- B1P, B2P: T/5 five-step workflows drained by one, then by two worker processes (ids
  ``bench-1``, ``bench-2``; concurrency C each): the scaling ratio.

For each scenario, the raw floor (``bench/raw_floor.py``, at the scenario's concurrency) runs
the same tasks in every mode (A, B, C, A32 only); a statement probe times the engine's claim
(batch 16, rolled back) and ``idle_state`` on a database seeded the same way; then the worker
processes (``python -m toolkit run --until-idle``, the production process tree) drain the
tasks, timed from the first spawn to the last exit ("wall") and by the supervisor's own
report ("run": process start and exit excluded). Every run gets a freshly created, migrated
and seeded database; the best of ``--repeat`` runs is kept and the median reported beside it
(the machine may be shared). CPU time and peak RSS come from ``wait4(2)``, commits and rows
per task from ``pg_stat_database``, bytes per task from ``pg_total_relation_size`` of the task
tables after the run (and after ``VACUUM FULL``), claim → done latency from the task events
(database time). After each run, with the queue drained, the probe times the idle path
(an empty claim and ``idle_state``) again.

Idle latency (``--idle-submits``): one worker, started on an empty queue (or with W parked
timers), idle on LISTEN/NOTIFY; tasks are submitted one at a time ``--idle-interval-ms``
apart; submit → claim comes from the task events (see ``bench/latency.py``).

Run: ``.venv/bin/python bench/throughput.py [--tasks N] [--concurrency C] [--dsn DSN]
[--scenarios A,B,C,A32,A32T,B1P,B2P] [--json PATH] [--profile DIR]``; without ``--dsn`` a
temporary embedded server is used. All numbers are measurements; nothing here asserts a
timing (the targets are printed beside them).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.latency import IdleLatency, StatementProbe, measure_idle_latency, probe_statements
from bench.processes import REPO, WorkerRun, park_timers, run_workers
from bench.raw_floor import FLOOR_MODES, MODES, FloorResult, Mode, run_floor
from bench.workload import (
    TIMER,
    Counters,
    Deployable,
    Percentiles,
    Workload,
    bench_server,
    counters,
    event_latency,
    scratch_database,
    seed,
    server_cpu,
    stored_bytes,
    task_states,
    write_definitions,
)

#: The floor modes that, like the engine, commit every task-write on its own.
PER_WRITE_MODES: tuple[Mode, ...] = ("commit-per-write", "engine-sql")
#: The issue's targets.
TARGET_WORKFLOWS_PER_S = 4000.0
TARGET_IDLE_P50_MS = 10.0
TARGET_IDLE_P99_MS = 50.0
#: Issue 22: one-step workflows at concurrency 32 against the raw floor's best mode.
TARGET_OVER_FLOOR = 0.7


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A workload and how it is run.

    Attributes:
        key: its name on the command line.
        title: what it is.
        workload: the definition of its tasks.
        divisor: it runs ``N // divisor`` tasks.
        target: N is ``--target-tasks`` (else ``--tasks``).
        concurrency: the worker concurrency; None for ``--concurrency``.
        processes: worker processes draining the queue together.
        waiting: ``--waiting`` parked timer tasks sit in the database throughout.
        floor: measure the raw floor too.
    """

    key: str
    title: str
    workload: Workload
    divisor: int = 1
    target: bool = False
    concurrency: int | None = None
    processes: int = 1
    waiting: bool = False
    floor: bool = True


A1 = Workload(1, idempotent=True)
B5 = Workload(5, idempotent=True)
SCENARIOS = (
    Scenario("A", "1-step idempotent", A1),
    Scenario("B", "5-step idempotent", B5, divisor=5),
    Scenario("C", "5-step non-idempotent", Workload(5, idempotent=False), divisor=5),
    Scenario("A32", "1-step, concurrency 32", A1, target=True, concurrency=32),
    Scenario("A32T", "A32 + waiting timers", A1, target=True, concurrency=32, waiting=True,
             floor=False),
    Scenario("B1P", "5-step, 1 process", B5, divisor=5, target=True, floor=False),
    Scenario("B2P", "5-step, 2 processes", B5, divisor=5, target=True, processes=2,
             floor=False),
)  # fmt: skip
SCENARIO_KEYS = {scenario.key: scenario for scenario in SCENARIOS}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A scenario resolved against the command line."""

    scenario: Scenario
    tasks: int
    concurrency: int
    waiting: int

    @property
    def steps(self) -> int:
        return self.tasks * self.scenario.workload.steps

    def expected_states(self) -> dict[str, int]:
        """Task states after a complete run."""
        return {"succeeded": self.tasks, **({"waiting": self.waiting} if self.waiting else {})}


def resolve(scenario: Scenario, args: argparse.Namespace) -> Plan:
    total = args.target_tasks if scenario.target else args.tasks
    return Plan(
        scenario=scenario,
        tasks=max(1, total // scenario.divisor),
        concurrency=scenario.concurrency or args.concurrency,
        waiting=args.waiting if scenario.waiting else 0,
    )


@dataclasses.dataclass(frozen=True)
class Row:
    """Everything measured for one scenario (see the tables for what is printed)."""

    scenario: str
    key: str
    processes: int
    concurrency: int
    waiting: int
    tasks: int
    steps: int
    wall_s: float
    workflows_per_s: float
    steps_per_s: float
    wall_runs_s: list[float]
    supervisor_runs_s: list[float]
    floor_steps_per_s: float | None
    engine_over_floor: float | None
    floor_rounds_steps_per_s: list[float]
    worker_peak_rss_mb: float
    floor_mode: str | None
    floor_by_mode: dict[str, float]
    supervisor_wall_s: float
    worker_cpu_s: float
    server_cpu_s: float | None
    worker_cpu_us_per_step: float
    max_loop_lag_ms: int
    claim_to_done_ms: Percentiles
    probe_busy: StatementProbe
    probe_idle: StatementProbe
    commits_per_task: float
    rows_inserted_per_task: float
    rows_updated_per_task: float
    floor_commits_per_task: dict[str, float]
    bytes_per_task: float
    bytes_per_task_live: float
    live_bytes_per_task_by_table: dict[str, float]
    floor_bytes_per_task_live: float | None
    startup_wall_s: float
    startup_cpu_s: float
    profile: str | None

    @property
    def run_steps_per_s(self) -> float:
        return self.steps / self.supervisor_wall_s

    @property
    def run_workflows_per_s(self) -> float:
        return self.tasks / self.supervisor_wall_s

    @property
    def cpu_us_per_step_after_startup(self) -> float:
        return (self.worker_cpu_s - self.processes * self.startup_cpu_s) / self.steps * 1e6


# --- the floor --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FloorMeasure:
    """The best floor run of one mode, its commits and live table bytes per task."""

    result: FloorResult
    commits_per_task: float
    live_bytes_per_task: float


def measure_floor(plan: Plan, server: str, *, batch: int, repeat: int) -> dict[Mode, FloorMeasure]:
    """Best of ``repeat`` floor runs per mode, each in a freshly seeded database."""
    workload, tasks = plan.scenario.workload, plan.tasks
    best: dict[Mode, FloorMeasure] = {}
    for mode in MODES:
        for _ in range(repeat):
            with scratch_database(server, f"bench_{plan.scenario.key.lower()}_floor") as dsn:
                seed(dsn, workload, tasks)
                before = counters(dsn)
                result = run_floor(
                    dsn, workload, concurrency=plan.concurrency, batch=batch, mode=mode
                )
                commits = (counters(dsn) - before).commits
                _check_finished(dsn, {"succeeded": tasks}, f"floor {mode}")
                size = sum(stored_bytes(dsn, compact=True).values())
            if mode not in best or result.wall < best[mode].result.wall:
                best[mode] = FloorMeasure(result, commits / tasks, size / tasks)
    return best


def floor_beside(plan: Plan, server: str, *, batch: int, mode: Mode) -> float:
    """One floor run of ``mode`` in a freshly seeded database, steps/s: the run beside an
    engine run of the same round (the target's ratio is taken per round)."""
    with scratch_database(server, f"bench_{plan.scenario.key.lower()}_floor") as dsn:
        seed(dsn, plan.scenario.workload, plan.tasks)
        result = run_floor(dsn, plan.scenario.workload, concurrency=plan.concurrency,
                           batch=batch, mode=mode)  # fmt: skip
        _check_finished(dsn, {"succeeded": plan.tasks}, f"floor {mode}")
    return result.steps_per_second


def best_floor(floors: dict[Mode, FloorMeasure]) -> tuple[Mode | None, FloorMeasure | None]:
    """The fastest floor mode proper (``engine-sql`` is a diagnostic), if any was measured."""
    if not floors:
        return None, None
    mode = min(FLOOR_MODES, key=lambda m: floors[m].result.wall)
    return mode, floors[mode]


def _check_finished(dsn: str, expected: dict[str, int], what: str) -> None:
    states = task_states(dsn)
    if states != expected:
        raise RuntimeError(f"{what}: expected task states {expected}, found {states}")


# --- the engine -------------------------------------------------------------------------------


def seed_plan(dsn: str, plan: Plan, folder: Path) -> Path:
    """Park the plan's waiting timers (if any), queue its tasks; return the worker's
    definitions folder (the workload, and the timer definition when timers wait)."""
    if plan.waiting:
        park_timers(dsn, folder / "park", plan.waiting)
    seed(dsn, plan.scenario.workload, plan.tasks)
    return write_definitions(folder / "run", _loaded(plan))


def _loaded(plan: Plan) -> list[Deployable]:
    """The definitions the plan's worker loads."""
    return [plan.scenario.workload, *([TIMER] if plan.waiting else [])]


def _digests(plan: Plan) -> list[str]:
    return [workload.definition().digest for workload in _loaded(plan)]


@dataclasses.dataclass(frozen=True)
class EngineMeasure:
    """The worker run with the database's counters, sizes and latencies around it."""

    run: WorkerRun
    delta: Counters
    server_cpu: float | None
    bytes_after: dict[str, int]
    bytes_live: dict[str, int]
    claim_to_done: Percentiles
    probe_idle: StatementProbe


def measure_engine(
    plan: Plan, server: str, *, processes: int | None = None, profile: Path | None = None
) -> EngineMeasure:
    """Seed a fresh database and drain it with the plan's worker processes."""
    workload = plan.scenario.workload
    with (
        scratch_database(server, f"bench_{plan.scenario.key.lower()}_engine") as dsn,
        tempfile.TemporaryDirectory(prefix="runifold-bench-") as folder,
    ):
        definitions = seed_plan(dsn, plan, Path(folder))
        before, cpu_before = counters(dsn), server_cpu(dsn)
        run = run_workers(
            dsn, definitions, plan.concurrency,
            processes=processes or plan.scenario.processes, profile=profile,
        )  # fmt: skip
        cpu_after = server_cpu(dsn)
        delta = counters(dsn) - before
        _check_finished(dsn, plan.expected_states(), "engine")
        latency = event_latency(dsn, workload.name, "claimed", "succeeded")
        probe = probe_statements(dsn, _digests(plan))  # the queue is drained: the idle path
        return EngineMeasure(
            run=run,
            delta=delta,
            server_cpu=None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
            bytes_after=stored_bytes(dsn),
            bytes_live=stored_bytes(dsn, compact=True),
            claim_to_done=latency,
            probe_idle=probe,
        )


def measure_busy_probe(plan: Plan, server: str) -> StatementProbe:
    """The claim path's statements on a database seeded like the runs (the busy path)."""
    with (
        scratch_database(server, f"bench_{plan.scenario.key.lower()}_probe") as dsn,
        tempfile.TemporaryDirectory(prefix="runifold-bench-") as folder,
    ):
        seed_plan(dsn, plan, Path(folder))
        return probe_statements(dsn, _digests(plan))


def measure_startup(server: str, concurrency: int) -> WorkerRun:
    """A worker on an empty queue: interpreter start, imports, pool, register, exit."""
    plan = Plan(SCENARIOS[0], tasks=0, concurrency=concurrency, waiting=0)
    with (
        scratch_database(server, "bench_startup") as dsn,
        tempfile.TemporaryDirectory(prefix="runifold-bench-") as folder,
    ):
        return run_workers(dsn, seed_plan(dsn, plan, Path(folder)), concurrency)


# --- one scenario -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Baseline:
    """What is measured once per scenario, before the worker runs: floor and busy probe."""

    floors: dict[Mode, FloorMeasure]
    probe_busy: StatementProbe


def measure_baseline(plan: Plan, server: str, args: argparse.Namespace) -> Baseline:
    floors = (
        measure_floor(plan, server, batch=args.floor_batch, repeat=args.repeat)
        if plan.scenario.floor
        else {}
    )
    return Baseline(floors, measure_busy_probe(plan, server))


def make_row(
    plan: Plan,
    baseline: Baseline,
    runs: Sequence[EngineMeasure],
    floor_rounds: Sequence[float],
    startup: WorkerRun,
    profile: Path | None,
) -> Row:
    """The row of one scenario: its best-wall engine run, with every run's rates beside it."""
    scenario, floors = plan.scenario, baseline.floors
    engine = min(runs, key=lambda measured: measured.run.wall)
    best_mode, best = best_floor(floors)
    floor = None if best is None else best.result.steps_per_second
    run, tasks, steps = engine.run, plan.tasks, plan.steps
    stored_tasks = tasks + plan.waiting  # bytes are per row of toolkit_tasks
    return Row(
        scenario=f"{scenario.key}: {scenario.title}",
        key=scenario.key,
        processes=run.processes,
        concurrency=plan.concurrency,
        waiting=plan.waiting,
        tasks=tasks,
        steps=steps,
        wall_s=run.wall,
        workflows_per_s=tasks / run.wall,
        steps_per_s=steps / run.wall,
        wall_runs_s=[measured.run.wall for measured in runs],
        supervisor_runs_s=[measured.run.supervisor_wall for measured in runs],
        floor_steps_per_s=floor,
        engine_over_floor=None if floor is None else steps / run.wall / floor,
        floor_rounds_steps_per_s=list(floor_rounds),
        worker_peak_rss_mb=run.peak_rss / 2**20,
        floor_mode=best_mode,
        floor_by_mode={m: f.result.steps_per_second for m, f in floors.items()},
        supervisor_wall_s=run.supervisor_wall,
        worker_cpu_s=run.cpu,
        server_cpu_s=engine.server_cpu,
        worker_cpu_us_per_step=run.cpu / steps * 1e6,
        max_loop_lag_ms=run.max_loop_lag_ms,
        claim_to_done_ms=engine.claim_to_done,
        probe_busy=baseline.probe_busy,
        probe_idle=engine.probe_idle,
        commits_per_task=engine.delta.commits / tasks,
        rows_inserted_per_task=engine.delta.inserted / tasks,
        rows_updated_per_task=engine.delta.updated / tasks,
        floor_commits_per_task={m: f.commits_per_task for m, f in floors.items()},
        bytes_per_task=sum(engine.bytes_after.values()) / stored_tasks,
        bytes_per_task_live=sum(engine.bytes_live.values()) / stored_tasks,
        live_bytes_per_task_by_table={t: b / stored_tasks for t, b in engine.bytes_live.items()},
        floor_bytes_per_task_live=None if best is None else best.live_bytes_per_task,
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


def _opt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pct(p: Percentiles) -> str:
    return f"{p.p50:.1f} / {p.p99:.1f}"


def _shape(r: Row) -> str:
    return f"{r.processes}x{r.concurrency}"


def _cpu(r: Row) -> str:
    """Worker and server CPU seconds of the run, and the cores they kept busy on average."""
    if r.server_cpu_s is None:
        return f"{r.worker_cpu_s:.2f}+?"
    cores = (r.worker_cpu_s + r.server_cpu_s) / r.wall_s
    return f"{r.worker_cpu_s:.2f}+{r.server_cpu_s:.2f} ({cores:.1f})"


def main_table(rows: Sequence[Row]) -> str:
    headers = [
        "scenario", "procs x conc", "tasks", "steps", "wall s", "workflows/s", "steps/s",
        "run workflows/s", "run steps/s", "CPU s worker+server (cores)",
        "claim->done ms p50/p99", "floor steps/s", "engine/floor", "peak RSS MB", "bytes/task",
    ]  # fmt: skip
    return _table(headers, [
        [r.scenario, _shape(r), str(r.tasks), str(r.steps), f"{r.wall_s:.2f}",
         f"{r.workflows_per_s:,.0f}", f"{r.steps_per_s:,.0f}", f"{r.run_workflows_per_s:,.0f}",
         f"{r.run_steps_per_s:,.0f}", _cpu(r), _pct(r.claim_to_done_ms),
         "-" if r.floor_steps_per_s is None else f"{r.floor_steps_per_s:,.0f} ({r.floor_mode})",
         _opt(r.engine_over_floor, ".3f"), f"{r.worker_peak_rss_mb:.1f}",
         f"{r.bytes_per_task_live:,.0f}"]
        for r in rows
    ])  # fmt: skip


def _rates(amount: int, seconds: Sequence[float]) -> str:
    """best / median / worst of ``amount`` over each of ``seconds``."""
    rates = sorted((amount / s for s in seconds), reverse=True)
    return f"{rates[0]:,.0f} / {statistics.median(rates):,.0f} / {rates[-1]:,.0f}"


def spread_table(rows: Sequence[Row]) -> str:
    """Every engine run of every scenario: best, median and worst rate."""
    headers = [
        "scenario", "runs", "wall workflows/s best/median/worst", "run workflows/s best/med/worst",
        "wall steps/s best/median/worst", "run steps/s best/median/worst",
    ]  # fmt: skip
    return _table(headers, [
        [r.key, str(len(r.wall_runs_s)), _rates(r.tasks, r.wall_runs_s),
         _rates(r.tasks, r.supervisor_runs_s), _rates(r.steps, r.wall_runs_s),
         _rates(r.steps, r.supervisor_runs_s)]
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
        if not r.floor_by_mode:
            continue
        run = r.run_steps_per_s
        table.append([
            r.key, *(f"{r.floor_by_mode[m]:,.0f}" for m in MODES),
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
        [r.key, f"{r.commits_per_task:.2f}",
         *(_opt(r.floor_commits_per_task.get(m), ".2f") for m in PER_WRITE_MODES),
         f"{r.rows_inserted_per_task:.1f}+{r.rows_updated_per_task:.1f}",
         f"{r.bytes_per_task:,.0f}", f"{r.bytes_per_task_live:,.0f}",
         "+".join(f"{b:,.0f}" for b in r.live_bytes_per_task_by_table.values()),
         _opt(r.floor_bytes_per_task_live, ",.0f")]
        for r in rows
    ])  # fmt: skip


def probe_table(rows: Sequence[Row]) -> str:
    """The claim path's statements, busy (queue full) and idle (queue drained)."""
    headers = [
        "scenario", "waiting", "busy: claim(16) ms p50/p99", "busy: idle_state ms",
        "idle: empty claim ms p50/p99", "idle: idle_state ms p50/p99",
    ]  # fmt: skip
    return _table(headers, [
        [r.key, str(r.waiting), _pct(r.probe_busy.claim), _pct(r.probe_busy.idle_state),
         _pct(r.probe_idle.claim), _pct(r.probe_idle.idle_state)]
        for r in rows
    ])  # fmt: skip


def idle_table(latencies: Sequence[IdleLatency]) -> str:
    headers = [
        "waiting timers", "submits", "every ms", "submit->claimed ms p50/p99/max",
        "submit->succeeded ms p50/p99/max", "worker RSS MB", "worker CPU s",
        "server xacts/task", "server CPU ms/task",
    ]  # fmt: skip
    return _table(headers, [
        [str(x.waiting), str(x.submits), f"{x.interval_ms:g}",
         f"{_pct(x.to_claimed)} / {x.to_claimed.max:.1f}",
         f"{_pct(x.to_succeeded)} / {x.to_succeeded.max:.1f}",
         f"{x.worker_peak_rss_mb:.1f}", f"{x.worker_cpu_s:.2f}", f"{x.xacts_per_task:.1f}",
         _opt(x.server_cpu_ms_per_task, ".1f")]
        for x in latencies
    ])  # fmt: skip


def comparison_table(base: Row, other: Row, what: str) -> str:
    """``other`` against ``base``: rates (best and median), latencies, RSS."""

    def median(row: Row, amount: Callable[[Row], int], runs: Callable[[Row], list[float]]) -> float:
        return statistics.median(amount(row) / s for s in runs(row))

    def line(r: Row) -> list[str]:
        return [
            r.key, _shape(r), str(r.waiting), f"{r.steps_per_s:,.0f}",
            f"{median(r, lambda x: x.steps, lambda x: x.wall_runs_s):,.0f}",
            f"{r.run_steps_per_s:,.0f}",
            f"{median(r, lambda x: x.steps, lambda x: x.supervisor_runs_s):,.0f}",
            _cpu(r), _pct(r.claim_to_done_ms), _pct(r.probe_busy.claim),
            _pct(r.probe_idle.claim), f"{r.worker_peak_rss_mb:.1f}",
        ]  # fmt: skip

    headers = [
        "scenario", "procs x conc", "waiting", "wall steps/s best", "median", "run steps/s best",
        "median", "CPU s worker+server (cores)", "claim->done ms", "busy claim ms",
        "idle claim ms", "peak RSS MB",
    ]  # fmt: skip
    ratio = [
        f"{what}: {other.key}/{base.key}", "", "",
        f"{other.steps_per_s / base.steps_per_s:.2f}", "",
        f"{other.run_steps_per_s / base.run_steps_per_s:.2f}", "",
        f"{_total_cpu(other) / _total_cpu(base):.2f}", "", "", "",
        f"{other.worker_peak_rss_mb / base.worker_peak_rss_mb:.2f}",
    ]  # fmt: skip
    return _table(headers, [line(base), line(other), ratio])


def _total_cpu(r: Row) -> float:
    return r.worker_cpu_s + (r.server_cpu_s or 0.0)


def targets(rows: Sequence[Row], latencies: Sequence[IdleLatency]) -> list[str]:
    """One line per target of the issue that this run measured: best and median runs."""
    by_key = {row.key: row for row in rows}
    lines = []
    if (a32 := by_key.get("A32")) is not None:
        goal = TARGET_WORKFLOWS_PER_S
        parts = []
        for what, seconds in (("wall", a32.wall_runs_s), ("run", a32.supervisor_runs_s)):
            best, median = max(a32.tasks / s for s in seconds), _median_rate(a32.tasks, seconds)
            parts.append(
                f"{what} best {best:,.0f} -> {_verdict(best >= goal)}, "
                f"median {median:,.0f} -> {_verdict(median >= goal)}"
            )
        lines.append(f"A32 >= {goal:,.0f} workflows/s: " + "; ".join(parts))
        if a32.floor_rounds_steps_per_s:
            # Round by round, the engine over the floor run beside it. wall: from the worker's
            # spawn to its exit (its start included, which the floor, run in this process, does
            # not have); run: over the supervisor's own time.
            parts = []
            for what, seconds in (("wall", a32.wall_runs_s), ("run", a32.supervisor_runs_s)):
                ratios = [
                    a32.steps / s / floor
                    for s, floor in zip(seconds, a32.floor_rounds_steps_per_s, strict=True)
                ]
                median = statistics.median(ratios)
                parts.append(f"{what} median {median:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                             f"-> {_verdict(median >= TARGET_OVER_FLOOR)}")  # fmt: skip
            lines.append(
                f"A32 >= {TARGET_OVER_FLOOR:g} x the raw floor ({a32.floor_mode}) run beside it, "
                f"same round ({len(a32.floor_rounds_steps_per_s)} rounds): " + "; ".join(parts)
            )
    for waiting in sorted({x.waiting for x in latencies}):
        runs = [x for x in latencies if x.waiting == waiting]
        p50 = statistics.median(x.to_claimed.p50 for x in runs)
        p99 = statistics.median(x.to_claimed.p99 for x in runs)
        lines.append(
            f"idle submit->claimed, {waiting} waiting timers (median of {len(runs)} runs): "
            f"p50 {p50:.1f} ms <= {TARGET_IDLE_P50_MS:g} -> {_verdict(p50 <= TARGET_IDLE_P50_MS)}"
            f", p99 {p99:.1f} ms <= {TARGET_IDLE_P99_MS:g} -> "
            f"{_verdict(p99 <= TARGET_IDLE_P99_MS)}"
        )
    if (one := by_key.get("B1P")) is not None and (two := by_key.get("B2P")) is not None:
        best = two.steps_per_s / one.steps_per_s
        median = _median_rate(two.steps, two.wall_runs_s) / _median_rate(one.steps, one.wall_runs_s)
        lines.append(
            f"2 processes faster than 1 (B2P/B1P wall steps/s): best {best:.2f}x -> "
            f"{_verdict(best > 1)}, median {median:.2f}x -> {_verdict(median > 1)}"
        )
    return lines


def _median_rate(amount: int, seconds: Sequence[float]) -> float:
    return statistics.median(amount / s for s in seconds)


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


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


def scenario_keys(text: str) -> list[Scenario]:
    """``A,B,A32`` (or run together, ``ABC``) → the scenarios, in the order given, once each.

    Raises:
        argparse.ArgumentTypeError: something is not a scenario key.
    """
    pattern = "|".join(sorted(map(re.escape, SCENARIO_KEYS), key=len, reverse=True))
    cleaned = re.sub(r"[\s,]+", "", text.upper())
    found = re.findall(pattern, cleaned)
    if "".join(found) != cleaned:
        raise argparse.ArgumentTypeError(
            f"unknown scenario in {text!r}; known: {', '.join(SCENARIO_KEYS)}"
        )
    return [SCENARIO_KEYS[key] for key in dict.fromkeys(found)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--tasks", type=int, default=2000, help="N of scenarios A, B, C (default 2000)")
    add(
        "--target-tasks",
        type=int,
        default=10_000,
        help="N of scenarios A32, A32T, B1P, B2P (default 10000)",
    )
    add(
        "--concurrency",
        type=int,
        default=8,
        help="worker concurrency per process, but in A32 and A32T: 32 (default 8)",
    )
    add(
        "--waiting",
        type=int,
        default=10_000,
        help="parked timers in A32T and in the second idle-latency run (default 10000)",
    )
    add("--dsn", help="server DSN (default: a temporary embedded server)")
    add("--home", help="embedded server home to reuse (left running)")
    add(
        "--scenarios",
        type=scenario_keys,
        default=list(SCENARIOS),
        help=f"which scenarios, in order (default {','.join(SCENARIO_KEYS)})",
    )
    add(
        "--idle-submits",
        type=int,
        default=200,
        help="tasks submitted one at a time to an idle worker; 0 skips (default 200)",
    )
    add(
        "--idle-interval-ms",
        type=float,
        default=20.0,
        help="between two idle submits (default 20)",
    )
    add("--floor-batch", type=int, default=32, help="floor claim batch (32)")
    add(
        "--repeat",
        type=int,
        default=3,
        help="runs of the worker (each with a floor run beside it), of each floor mode and of "
        "each idle latency (3)",
    )
    add("--json", type=Path, help="write the rows and idle latencies to this file")
    add("--profile", type=Path, help="one extra worker run per scenario under py-spy (folder)")
    return parser.parse_args(argv)


def run_scenarios(server: str, args: argparse.Namespace) -> list[Row]:
    """Floors and probes scenario by scenario, then the engine runs round-robin (every
    scenario once, ``--repeat`` times), so that a slow spell of a shared machine does not
    fall on one scenario's runs only. A scenario with a floor runs its best floor mode once
    more in each round, just before or just after its engine run (in turn): the target's
    engine/floor ratio is taken round by round, between runs made together."""
    startup = measure_startup(server, args.concurrency)
    plans = [resolve(scenario, args) for scenario in args.scenarios]
    baselines = [measure_baseline(plan, server, args) for plan in plans]
    runs: list[list[EngineMeasure]] = [[] for _ in plans]
    floor_rounds: list[list[float]] = [[] for _ in plans]
    for round_ in range(1, args.repeat + 1):
        for plan, baseline, measured, floors in zip(plans, baselines, runs, floor_rounds,
                                                    strict=True):  # fmt: skip
            mode, _ = best_floor(baseline.floors)
            floor_first = round_ % 2 == 0  # the floor's run before the engine's, or after
            if mode is not None and floor_first:
                floors.append(floor_beside(plan, server, batch=args.floor_batch, mode=mode))
            measured.append(measure_engine(plan, server))
            if mode is not None and not floor_first:
                floors.append(floor_beside(plan, server, batch=args.floor_batch, mode=mode))
            rate = plan.steps / measured[-1].run.wall
            beside_text = f", floor beside {floors[-1]:,.0f}" if floors else ""
            print(
                f"run {round_}, {plan.scenario.key}: {rate:,.0f} steps/s{beside_text}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    profiles: list[Path | None] = [None] * len(plans)
    if args.profile is not None:  # one more run each, sampled, kept out of the numbers
        for index, plan in enumerate(plans):
            profiles[index] = args.profile / f"worker-{plan.scenario.key}.txt"
            measure_engine(plan, server, profile=profiles[index])
    return [
        make_row(plan, baseline, measured, floors, startup, profile)
        for plan, baseline, measured, floors, profile in zip(
            plans, baselines, runs, floor_rounds, profiles, strict=True
        )
    ]


def run_idle_latency(server: str, args: argparse.Namespace) -> Iterator[IdleLatency]:
    if args.idle_submits <= 0:
        return
    for waiting in dict.fromkeys([0, args.waiting]):
        for _ in range(args.repeat):
            latency = measure_idle_latency(
                server, A1, submits=args.idle_submits, interval=args.idle_interval_ms / 1000,
                concurrency=args.concurrency, waiting=waiting,
            )  # fmt: skip
            print(
                f"idle latency, {waiting} waiting: submit->claimed {_pct(latency.to_claimed)} ms",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            yield latency


def report(rows: Sequence[Row], latencies: Sequence[IdleLatency], args: argparse.Namespace) -> None:
    where = args.dsn or "embedded server"
    print(
        f"runifold throughput: {where}, concurrency {args.concurrency} (A32*: 32), no-op "
        f"effects, best of {args.repeat}, code {_code_version()}"
    )
    print(main_table(rows))
    print(
        "(wall = first worker spawn to last exit; run = the supervisor's own wall time, process "
        "start and exit excluded; claim->done = claimed to succeeded event, database time; "
        "engine/floor = wall steps/s over the best floor mode's at the same concurrency; "
        "bytes/task = live bytes per toolkit_tasks row after VACUUM FULL, parked timers "
        "included)\n"
    )
    print(spread_table(rows))
    print("(every engine run of the scenario; the tables keep the best-wall run)\n")
    if any(r.floor_by_mode for r in rows):
        print(time_table(rows))
        print(
            "(engine run/s: steps over the supervisor's own wall time; engine-sql: the engine's "
            "SQL and parameters without its Python)\n"
        )
    print(storage_table(rows))
    if rows:
        print(
            f"(worker startup and exit on an empty queue: {rows[0].startup_wall_s:.2f} s wall, "
            f"{rows[0].startup_cpu_s:.2f} s CPU; included in 'wall s'); live by table: "
            + " + ".join(rows[0].live_bytes_per_task_by_table)
            + "\n"
        )
        print(probe_table(rows))
        print(
            "(the engine's claim_tasks, rolled back, and idle_state, timed by a client; busy: "
            "queue seeded as for the run; idle: after the run, queue drained)\n"
        )
    if latencies:
        print(idle_table(latencies))
        print(
            "(one idle worker on LISTEN/NOTIFY; tasks submitted one at a time; event times are "
            "database time; xacts and server CPU per task: while submitting, the submit, "
            "group commit, and every claim and idle check the worker ran meanwhile)\n"
        )
    by_key = {row.key: row for row in rows}
    for base, other, what in (("B1P", "B2P", "scaling"), ("A32", "A32T", "waiting timers")):
        if base in by_key and other in by_key:
            print(comparison_table(by_key[base], by_key[other], what) + "\n")
    for line in targets(rows, latencies):
        print(f"target: {line}")
    for row in rows:
        if row.profile is not None:
            print(f"\nworker profile, {row.scenario} ({row.profile}):")
            print(top_frames(Path(row.profile)))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with bench_server(args.dsn, args.home) as server:
        latencies = list(run_idle_latency(server, args))
        rows = run_scenarios(server, args)
    report(rows, latencies, args)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "rows": [dataclasses.asdict(r) for r in rows],
            "idle_latency": [dataclasses.asdict(x) for x in latencies],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
