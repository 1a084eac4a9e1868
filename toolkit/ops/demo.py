"""``toolkit demo``: deploy the example definitions, submit tasks on real input, run them.

The input ships with the repository in ``definitions/data/``: a year of daily readings of a
dozen weather stations (one CSV file each) and 300 orders (``orders.jsonl``). The demo
submits

- ``file-ingest``: one task per CSV file (all numeric columns) and one per (file, numeric
  column), each writing its JSON report to ``HOME/reports``;
- ``order-saga``: one task per order;

then runs an in-process worker (:class:`~toolkit.runtime.supervisor.WorkflowSupervisor` over the
example handlers of :mod:`toolkit.examples`) until the queue drains.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from toolkit.definition import WorkflowDefinition, load_definitions
from toolkit.errors import ConfigError, UnknownTask
from toolkit.examples import app, ensure_example_tables
from toolkit.examples.ingest import profile_table, read_table
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
    """

    submitted: dict[str, int]
    tasks_by_state: dict[str, int]
    effects_run: int
    wall_time: float
    report_dir: str

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
        lines = [f"runifold demo: {self.total} tasks in {self.wall_time:.2f} s", "", "submitted"]
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
        return "\n".join(lines)


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
        for record in await store.tasks.list(name=name, limit=len(wanted)):
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
    supervisor = WorkflowSupervisor(
        # Its own id, so the demo runs beside a `toolkit run` started in the same folder.
        Worker(store, app, runnable, worker_id=f"demo:{socket.gethostname()}:{os.getpid()}"),
        SupervisorConfig(concurrency=concurrency, until_idle=True),
    )
    await supervisor.run()
    wall_time = time.monotonic() - started
    completed_after = (await store.tasks.evidence_counts()).get("completed", 0)

    return DemoSummary(
        submitted={name: len(task_ids) for name, task_ids in ids.items()},
        tasks_by_state=await _states(store, ids),
        effects_run=completed_after - completed_before,
        wall_time=wall_time,
        report_dir=str(report_dir),
    )
