"""``toolkit demo``: deploy the example definitions, submit tasks on real input, run them.

The input ships with the repository in ``definitions/data/``: a year of daily readings of a
dozen weather stations (one CSV file each) and 300 orders (``orders.jsonl``). The demo
submits

- ``file-ingest``: one task per CSV file (all numeric columns) and one per (file, numeric
  column), each writing its JSON report to ``HOME/reports``;
- ``order-saga``: one task per order;

then tells the story the product is for (:mod:`toolkit.ops.demo_crash`): a worker process
crashes right after a payment call, before recording it; the in-process worker
(:class:`~toolkit.runtime.supervisor.WorkflowSupervisor` over the example handlers of
:mod:`toolkit.examples`) takes its tasks over once their leases expire, retries the bookings
a busy carrier refused, and leaves the uncertain charge waiting for reconciliation instead of
charging twice; the demo reconciles it from the payment outbox, and the queue drains. Last,
the patterns of branches that wait run (:mod:`toolkit.ops.demo_patterns`): parallel
approvals, a poll racing a deadline, file restores with callbacks, and a CI pipeline.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from toolkit.counts import counted
from toolkit.definition import WorkflowDefinition, load_definitions
from toolkit.errors import ConfigError, UnknownTask
from toolkit.examples import app, ensure_example_tables
from toolkit.examples.ingest import profile_table, read_table
from toolkit.lifecycle import TERMINAL_STATES
from toolkit.ops.demo_crash import Crash, Reconciliation, crash_a_worker, reconcile_charges
from toolkit.ops.demo_events import EventRun, run_events
from toolkit.ops.demo_patterns import PatternRun, run_patterns
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

logger = logging.getLogger(__name__)

INGEST = "file-ingest"
"""Name of the file ingest definition."""
ORDERS = "order-saga"
"""Name of the order saga definition."""

_TENANTS = {INGEST: "analytics", ORDERS: "shop"}


@dataclasses.dataclass(frozen=True)
class DemoSummary:
    """What one demo run did.

    Attributes:
        submitted: tasks submitted, by definition name.
        tasks_by_state: this run's tasks by their state at the end.
        effects_run: ``completed`` effect evidence records written during the run.
        wall_time: seconds from the first submission until the queue drained.
        report_dir: absolute path of the folder the ingest reports went to.
        crash: how the crashing worker ended (None: the run had no crash).
        recovered: tasks the next worker took over after their lease expired.
        retried: effect attempts that failed and were scheduled again.
        reconciled: the uncertain charges, and what reconciling them found.
        patterns: how the patterns of branches that wait ended (None: not run).
        events: what the shop's events started and reached (None: not run).
    """

    submitted: dict[str, int]
    tasks_by_state: dict[str, int]
    effects_run: int
    wall_time: float
    report_dir: str
    crash: Crash | None = None
    recovered: int = 0
    retried: int = 0
    reconciled: tuple[Reconciliation, ...] = ()
    patterns: PatternRun | None = None
    events: EventRun | None = None

    @property
    def total(self) -> int:
        """Tasks submitted in all."""
        return sum(self.submitted.values())

    @property
    def tasks_per_second(self) -> float:
        """Tasks finished per second of wall time (0 when no time passed)."""
        return self.total / self.wall_time if self.wall_time > 0 else 0.0

    def render(self) -> str:
        """The multi-line text ``toolkit demo`` prints."""
        width = max(len(name) for name in [*self.submitted, *self.tasks_by_state, "total"])
        title = f"runifold demo: {counted(self.total, 'task')} in {self.wall_time:.2f} s"
        lines = [title, "", "submitted"]
        lines += [
            f"  {name:<{width}}  {count:>6}" for name, count in sorted(self.submitted.items())
        ]
        lines += ["", "tasks by state"]
        lines += [
            f"  {state:<{width}}  {count:>6}"
            for state, count in sorted(self.tasks_by_state.items())
        ]
        lines += [
            "",
            f"effects run     {self.effects_run} (completed effect calls)",
            f"wall time       {self.wall_time:.2f} s",
            f"throughput      {self.tasks_per_second:.1f} tasks/s",
            f"reports         {self.report_dir}",
        ]
        story = self._story()
        if self.patterns is not None:
            story += self.patterns.lines()
        if self.events is not None:
            story += self.events.lines()
        return "\n".join(lines + story)

    def _story(self) -> list[str]:
        """What the crash, the retries and the reconciliation came to, in a few lines."""
        lines = ["", "what happened on the way"]
        if self.crash is not None:
            how = (
                "died right after a payment call, before recording its outcome"
                if self.crash.crashed
                else f"did not reach its fault and was stopped (exit {self.crash.exit_code})"
            )
            lines.append(f"  crash        worker {self.crash.worker_id} {how}")
        lines.append(
            f"  recovery     {counted(self.recovered, 'task')} taken over by the next worker "
            "once their leases expired, each from its last checkpoint"
        )
        lines.append(
            f"  retries      {counted(self.retried, 'effect attempt')} failed (a busy carrier) "
            "and ran again after a backoff"
        )
        if self.reconciled:
            through = [done for done in self.reconciled if done.payment_id]
            tasks = ", ".join(str(done.task_id) for done in self.reconciled)
            lines.append(
                f"  fail closed  {counted(len(self.reconciled), 'charge')} in flight lost "
                f"{'its' if len(self.reconciled) == 1 else 'their'} outcome; each task waited "
                f"for reconciliation instead of charging again (tasks {tasks})"
            )
            lines.append(
                f"  reconciled   from the payment outbox: {len(through)} had gone through "
                f"(recorded as such, charged once), {len(self.reconciled) - len(through)} had "
                "not (charged now)"
            )
        return lines


def ingest_inputs(data_dir: Path, report_dir: Path) -> list[dict[str, Any]]:
    """Inputs of ``file-ingest``: per CSV file, one for the whole file and one per numeric column.

    The CSV files are those under ``data_dir``, in sorted order. Paths are made absolute so
    the tasks run the same from any working directory.
    """
    inputs: list[dict[str, Any]] = []
    for csv_file in sorted(data_dir.rglob("*.csv")):
        base = {"path": str(csv_file.resolve()), "report_dir": str(report_dir)}
        inputs.append(base)
        for column in profile_table(read_table(csv_file))["numeric"]:
            inputs.append(base | {"columns": [column]})
    return inputs


def order_inputs(orders_file: Path) -> list[dict[str, Any]]:
    """Inputs of ``order-saga``: one per line of a JSON Lines file (blank lines skipped)."""
    with orders_file.open(encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def _latest(definitions: Iterable[WorkflowDefinition], name: str) -> WorkflowDefinition:
    versions = [d for d in definitions if d.name == name]
    if not versions:
        raise ConfigError(f"the demo needs a definition named {name!r} in its definitions folder")
    return max(versions, key=lambda d: d.version)


async def _states(store: Store, ids: dict[str, list[int]]) -> dict[str, int]:
    """The states of exactly these tasks: newest tasks per name, then any id not among them."""
    states: Counter[str] = Counter()
    for name, wanted in ids.items():
        missing = set(wanted)
        for record in await store.tasks.list(definition=name, limit=len(wanted)):
            if record.id in missing:
                missing.discard(record.id)
                states[record.state] += 1
        for task_id in sorted(missing):
            try:
                states[(await store.tasks.get(task_id)).state] += 1
            except UnknownTask:
                states["deleted"] += 1
    return dict(states)


async def run_demo(
    store: Store,
    definitions_dir: Path,
    *,
    home: Path,
    concurrency: int = 16,
    crash: bool = True,
    progress: Callable[[str], None] | None = None,
) -> DemoSummary:
    """Deploy the definitions, submit the demo tasks and run a worker until the queue drains.

    Every definition in ``definitions_dir`` is deployed; the worker runs ``file-ingest`` and
    ``order-saga`` with the handlers of :mod:`toolkit.examples`. Tasks of those definitions
    already queued in the database are run too, but the summary counts only this run's
    tasks (``effects_run`` counts every completed effect of the run).

    Args:
        store: an open store; give it a pool of at least ``concurrency`` connections.
        definitions_dir: the folder of the definitions, with the input in ``data/``.
        home: the toolkit home; reports go to ``home/reports``.
        concurrency: claim-and-execute cycles in flight at most.
        crash: first run a worker process that crashes mid-charge (needs the ``toolkit``
            command's module in this interpreter, as the package installs it).
        progress: called about once a second with a line of how far the run is.

    Returns:
        The summary to print.

    Raises:
        ConfigError: a definition or the input data is missing.
        DefinitionError: a definition file is invalid.
        DefinitionConflict: a definition version is registered with another digest.
    """
    definitions = load_definitions([definitions_dir])
    runnable = [_latest(definitions, INGEST), _latest(definitions, ORDERS)]
    data_dir = definitions_dir / "data"
    orders_file = data_dir / "orders.jsonl"
    if not orders_file.is_file():
        raise ConfigError(f"the demo input {orders_file} is missing")
    report_dir = (home / "reports").resolve()
    inputs: dict[WorkflowDefinition, Sequence[Any]] = {
        runnable[0]: ingest_inputs(data_dir, report_dir),
        runnable[1]: order_inputs(orders_file),
    }
    for definition in definitions:
        await store.definitions.deploy(definition)
    async with store.db.connection() as conn:
        await ensure_example_tables(conn)

    completed_before = (await store.tasks.evidence_counts()).get("completed", 0)
    ended_before = await _ended(store)
    started = time.monotonic()
    ids: dict[str, list[int]] = {}
    for definition, task_inputs in inputs.items():
        ids[definition.name] = await store.tasks.submit(
            definition, task_inputs, tenant=_TENANTS[definition.name]
        )
        logger.info(
            "demo tasks submitted",
            extra={
                "action": "demo_submit",
                "definition": definition.name,
                "count": len(task_inputs),
            },
        )
    crashed = None
    if crash:
        if progress is not None:
            progress("demo: a worker process runs, set to crash right after its first payment")
        crashed = await anyio.to_thread.run_sync(
            functools.partial(
                crash_a_worker, store.db.dsn, definitions_dir, concurrency=concurrency
            )
        )
    # Its own id, so the demo runs beside a `toolkit run` started in the same folder.
    worker = Worker(store, app, runnable, worker_id=f"demo:{socket.gethostname()}:{os.getpid()}")
    config = SupervisorConfig(concurrency=concurrency, until_idle=True)
    total = sum(len(task_ids) for task_ids in ids.values())
    async with anyio.create_task_group() as tg:
        if progress is not None:
            tg.start_soon(_report_progress, store, ended_before, total, progress)
        first = WorkflowSupervisor(worker, config)
        await first.run()
        reconciled = await reconcile_charges(store, ids[ORDERS])
        second = WorkflowSupervisor(worker, config)
        if reconciled:
            await second.run()
        tg.cancel_scope.cancel()
    wall_time = time.monotonic() - started
    completed_after = (await store.tasks.evidence_counts()).get("completed", 0)
    if progress is not None:
        progress("demo: branches that wait: approvals, a poll racing a deadline, restores, CI")
    patterns = await run_patterns(store, definitions, app)
    if progress is not None:
        progress("demo: events: orders started by order.placed, each waiting for its payment")
    events = await run_events(store, definitions, app)

    return DemoSummary(
        submitted={name: len(task_ids) for name, task_ids in ids.items()},
        tasks_by_state=await _states(store, ids),
        effects_run=completed_after - completed_before,
        wall_time=wall_time,
        report_dir=str(report_dir),
        crash=crashed,
        recovered=first.report.recovered + second.report.recovered,
        retried=first.report.retried + second.report.retried,
        reconciled=tuple(reconciled),
        patterns=patterns,
        events=events,
    )


async def _report_progress(
    store: Store, before: int, total: int, progress: Callable[[str], None]
) -> None:
    """Once a second, how many of the run's ``total`` tasks have ended.

    ``before``: tasks that had ended when the run began (the store may hold older runs).
    """
    while True:
        await anyio.sleep(1.0)
        ended = min(total, await _ended(store) - before)
        progress(f"demo: {ended:,} of {counted(total, 'task')} ended")


async def _ended(store: Store) -> int:
    counts = await store.tasks.counts_by_state()
    return sum(n for state, n in counts.items() if state in TERMINAL_STATES)
