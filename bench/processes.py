"""Worker subprocesses of the benchmark: the production ``python -m toolkit run`` process.

Every worker is reaped with ``wait4(2)``, which gives its CPU time; its last stdout line (the
supervisor's report) gives the supervisor's own wall time. A run of several processes is
timed from the first spawn to the last exit.

Peak RSS is the worker's ``VmHWM`` (``/proc/PID/status``), sampled every few milliseconds
while it runs: ``wait4``'s ``ru_maxrss`` is no good here, since Linux folds the memory image
the child had before ``exec`` (the benchmark's own, shared through vfork) into it, so it
reports at least the benchmark's RSS at spawn time.
"""

from __future__ import annotations

import compileall
import dataclasses
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import psycopg
from psycopg import sql

from bench.workload import TIMER, seed, vacuum_analyze, wait_for_states, write_definitions

REPO = Path(__file__).resolve().parents[1]
APP = "bench.noop_app"
_REPORT = re.compile(
    r"succeeded (?P<succeeded>\d+),.*waiting (?P<waiting>\d+),.*"
    r"max loop lag (?P<lag>\d+) ms, wall (?P<wall>[\d.]+) s"
)


@dataclasses.dataclass(frozen=True)
class WorkerRun:
    """One run of ``processes`` worker processes (sums and maxima over them).

    Attributes:
        wall: seconds from the first spawn to the last exit.
        cpu: user + system CPU seconds, all processes.
        peak_rss: the largest peak RSS of one process, bytes.
        supervisor_wall: the longest supervisor wall time (start and exit excluded).
        succeeded: cycles that succeeded a task, all processes.
        waiting: cycles that left a task waiting, all processes.
        max_loop_lag_ms: the longest event-loop stall of any process.
        processes: how many worker processes ran.
        reports: each process's report line.
    """

    wall: float
    cpu: float
    peak_rss: int
    supervisor_wall: float
    succeeded: int
    waiting: int
    max_loop_lag_ms: int
    processes: int
    reports: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Exited:
    """How one worker process ended."""

    ended: float
    returncode: int
    cpu: float
    peak_rss: int
    stdout: str
    stderr: str


def worker_command(
    dsn: str,
    definitions: Path,
    concurrency: int,
    worker_id: str,
    *,
    until_idle: bool = True,
    app: str = APP,
    options: Sequence[str] = (),
) -> list[str]:
    """The production worker: ``python -m toolkit run`` (until the queue drains, by default),
    with ``options`` of ``toolkit run`` added; the toolkit's bytecode compiled first."""
    compile_bytecode()
    command = [
        sys.executable, "-m", "toolkit", "--dsn", dsn, "run", "--app", app,
        "--definitions", str(definitions), "--concurrency", str(concurrency),
        "--worker-id", worker_id, *options,
    ]  # fmt: skip
    return [*command, "--until-idle"] if until_idle else command


@functools.cache
def compile_bytecode() -> None:
    """Write the bytecode of ``toolkit`` and ``bench`` once, as an installed package has it.

    A worker started from this checkout compiles every module from source when no
    ``__pycache__`` is there (``PYTHONDONTWRITEBYTECODE`` set, as on the CI machines): about
    0.15 s of CPU per start that a deployed worker, and the peers installed by pip, never
    spend. Python reads existing bytecode even when it does not write it.
    """
    root = Path(__file__).resolve().parents[1]
    for package in ("toolkit", "bench"):
        compileall.compile_dir(root / package, quiet=1)


class PeakRss:
    """Samples a process's ``VmHWM`` (peak RSS since its ``exec``) until stopped."""

    def __init__(self, pid: int, every: float = 0.01) -> None:
        self._path = Path(f"/proc/{pid}/status")
        self._every = every
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while (current := self._read()) is not None:
            self.peak = max(self.peak, current)
            if self._stop.wait(self._every):
                return

    def _read(self) -> int | None:
        """``VmHWM`` in bytes; 0 for a zombie (its memory is released); None once reaped."""
        try:
            status = self._path.read_text(encoding="ascii")
        except OSError:
            return None
        match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        return 0 if match is None else int(match[1]) * 1024

    def stop(self) -> int:
        """Stop sampling; the largest ``VmHWM`` seen, bytes."""
        self._stop.set()
        self._thread.join()
        return self.peak


class WorkerProcess:
    """One worker subprocess, its output captured in temporary files, its RSS sampled."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """Start ``command``; ``env`` adds to this process's environment (``PYTHONPATH``
        entries go before the repository's)."""
        extra = dict(env or {})
        path = [extra.pop("PYTHONPATH", None), str(REPO), os.environ.get("PYTHONPATH")]
        env = {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(filter(None, path))}
        self._out: IO[str] = tempfile.TemporaryFile("w+")
        self._err: IO[str] = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=self._out, stderr=self._err
        )
        self._rss = PeakRss(self._proc.pid)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def running(self) -> bool:
        return self._proc.poll() is None

    def terminate(self) -> None:
        """Ask for a graceful shutdown (SIGTERM), as an operator or a supervisor would."""
        if self.running():
            self._proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.running():
            self._proc.kill()

    def reap(self) -> Exited:
        """Wait for the exit with ``wait4`` and collect the output."""
        _, status, usage = os.wait4(self._proc.pid, 0)
        ended = time.perf_counter()
        peak_rss = self._rss.stop()
        self._proc.returncode = os.waitstatus_to_exitcode(status)
        outputs = []
        for stream in (self._out, self._err):
            stream.seek(0)
            outputs.append(stream.read())
            stream.close()
        return Exited(
            ended=ended,
            returncode=self._proc.returncode,
            cpu=usage.ru_utime + usage.ru_stime,
            peak_rss=peak_rss,
            stdout=outputs[0],
            stderr=outputs[1],
        )


def summarise(exits: Sequence[Exited], started: float) -> WorkerRun:
    """Parse each report line and combine the processes into one :class:`WorkerRun`.

    Raises:
        RuntimeError: a worker failed or printed no report.
    """
    matches = []
    for exited in exits:
        match = _REPORT.search(exited.stdout)
        if exited.returncode != 0 or match is None:
            raise RuntimeError(
                f"worker exited {exited.returncode}:\n{exited.stdout}\n{exited.stderr}"
            )
        matches.append(match)
    return WorkerRun(
        wall=max(exited.ended for exited in exits) - started,
        cpu=sum(exited.cpu for exited in exits),
        peak_rss=max(exited.peak_rss for exited in exits),
        supervisor_wall=max(float(match["wall"]) for match in matches),
        succeeded=sum(int(match["succeeded"]) for match in matches),
        waiting=sum(int(match["waiting"]) for match in matches),
        max_loop_lag_ms=max(int(match["lag"]) for match in matches),
        processes=len(exits),
        reports=tuple(exited.stdout.strip() for exited in exits),
    )


def run_workers(
    dsn: str,
    definitions: Path,
    concurrency: int,
    *,
    processes: int = 1,
    profile: Path | None = None,
    name: str = "bench",
    app: str = APP,
    env: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
) -> WorkerRun:
    """Spawn ``processes`` workers (ids ``NAME-1``, ``NAME-2``, ...) with ``--until-idle``
    (and ``options`` of ``toolkit run``) and wait for all of them; they run ``app`` with
    ``env`` added to their environment.

    With ``profile``, py-spy attaches to the first worker by pid (the measured process tree
    stays the production one) and writes raw collapsed stacks there.
    """
    py_spy = None if profile is None else find_py_spy()
    started = time.perf_counter()
    workers = [
        WorkerProcess(
            worker_command(
                dsn, definitions, concurrency, f"{name}-{index}", app=app, options=options
            ),
            env,
        )
        for index in range(1, processes + 1)
    ]
    spy = None
    try:
        if py_spy is not None and profile is not None:
            spy = attach_py_spy(py_spy, workers[0].pid, profile)
        exits = [worker.reap() for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
        if spy is not None:
            spy.wait()
    return summarise(exits, started)


def find_py_spy() -> str:
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise RuntimeError("--profile needs py-spy (e.g. `.venv/bin/pip install py-spy`)")
    return py_spy


def attach_py_spy(py_spy: str, pid: int, output: Path) -> subprocess.Popen[bytes]:
    """Sample ``pid`` until it exits (idle frames included), raw collapsed stacks."""
    output.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [py_spy, "record", "--pid", str(pid), "--rate", "250", "--idle",
         "--format", "raw", "--output", str(output)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def park_timers(
    dsn: str, folder: Path, count: int, *, concurrency: int = 32, by_worker: int | None = None
) -> None:
    """Queue ``count`` timer tasks and let one worker park them (``waiting``, reason
    ``timer``, ``run_at`` an hour ahead), as production would; then ``VACUUM (ANALYZE)``, as
    autovacuum would have by the time they matter.

    With ``by_worker``, only that many are parked by the worker and the rest are copies of
    their rows made in SQL (the same state, checkpoint and ``run_at``, new ids): a million
    parked tasks in seconds instead of ten minutes of claims.

    Raises:
        TimeoutError: the tasks did not all end up waiting.
    """
    parked = count if by_worker is None else min(count, by_worker)
    seed(dsn, TIMER, parked)
    run_workers(dsn, write_definitions(folder, [TIMER]), concurrency, name="bench-park")
    wait_for_states(dsn, {"waiting": parked}, timeout=5.0)
    if count > parked:
        _copy_parked(dsn, count - parked)
        wait_for_states(dsn, {"waiting": count}, timeout=5.0)
    vacuum_analyze(dsn)


def _copy_parked(dsn: str, more: int) -> None:
    """Insert ``more`` copies of the parked tasks' rows (every column but the id)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name = 'toolkit_tasks' AND column_name <> 'id'"
                " AND is_generated = 'NEVER' ORDER BY ordinal_position"
            )
        ]
        columns = sql.SQL(", ").join(map(sql.Identifier, names))
        parked = conn.execute("SELECT count(*) FROM toolkit_tasks").fetchone()
        assert parked is not None
        rounds = -(-more // parked[0])
        conn.execute(
            sql.SQL(
                "INSERT INTO toolkit_tasks ({columns})"
                " SELECT {columns} FROM toolkit_tasks, generate_series(1, %s) LIMIT %s"
            ).format(columns=columns),
            (rounds, more),
        )
