"""The demo's branches that wait: four patterns, with this module playing the outside world.

``parallel-approvals`` (three approvers, one of two requests rejected), ``poll-or-deadline``
(a job done in time, one that is not), ``restore-files`` (ten restores, two of whose
callbacks never come) and ``ci-pipeline`` (a test matrix in a child workflow beside a
manual approval). A worker runs them while :func:`run_patterns` acts as the approvers, the
storage service and the release manager: it answers each waiting branch as it parks, through
the same store calls as ``toolkit signal --branch`` and ``toolkit complete``.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterable
from typing import Any

import anyio

from toolkit.application import App
from toolkit.definition import WorkflowDefinition
from toolkit.errors import CallbackRefused, TaskTerminal
from toolkit.lifecycle import TERMINAL_STATES
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

#: The pattern definitions, and the inputs the demo submits to each.
PATTERNS: dict[str, list[dict[str, Any]]] = {
    "parallel-approvals": [{"request_id": "REQ-1"}, {"request_id": "REQ-2"}],
    "poll-or-deadline": [{"job_id": "job-2"}, {"job_id": "job-9"}],
    "restore-files": [{"files": [f"archive/{month:02d}.tar" for month in range(1, 11)]}],
    "ci-pipeline": [{"commit": "9f3c2e1"}],
}
#: The child workflow ``ci-pipeline`` starts (deployed, run by the same worker).
CHILDREN = ("ci-tests",)
#: Seconds the patterns may take before the demo gives up on them.
PATTERN_DEADLINE = 60.0
#: Files whose restore never completes (their items time out and are caught).
LOST_FILES = frozenset({"archive/04.tar", "archive/09.tar"})
#: The request one approver rejects.
REJECTED = ("REQ-2", "finance")


@dataclasses.dataclass(frozen=True)
class PatternRun:
    """How the patterns' tasks ended.

    Attributes:
        tasks: ``(definition, task id, state, result or error)`` of each task, in order.
        signals: signals sent to branches; completions: callbacks completed.
        waited_without_lease: tasks that waited for their branches (reason ``branches``),
            holding no lease: read from their histories (a ``waiting`` event of the step's
            branches is written with the write that gives the lease up).
    """

    tasks: tuple[tuple[str, int, str, Any], ...]
    signals: int
    completions: int
    waited_without_lease: int

    def lines(self) -> list[str]:
        """What the demo prints about them."""
        states: dict[str, list[str]] = {}
        for name, _, state, _ in self.tasks:
            states.setdefault(name, []).append(state)
        lines = [
            "",
            "branches that wait "
            f"({self.waited_without_lease} tasks waited for their branches holding no lease; "
            f"{self.signals} signals to branches, {self.completions} callbacks completed)",
        ]
        for name, ended in states.items():
            lines.append(f"  {name:<20} {', '.join(ended)}")
        return lines


def pattern_definitions(definitions: Iterable[WorkflowDefinition]) -> list[WorkflowDefinition]:
    """The newest version of each pattern definition and child among ``definitions``."""
    wanted = {*PATTERNS, *CHILDREN}
    newest: dict[str, WorkflowDefinition] = {}
    for definition in definitions:
        if definition.name in wanted:
            kept = newest.get(definition.name)
            if kept is None or definition.version > kept.version:
                newest[definition.name] = definition
    return list(newest.values())


async def run_patterns(
    store: Store, definitions: Iterable[WorkflowDefinition], app: App
) -> PatternRun:
    """Submit the patterns' tasks, run a worker, and answer their waiting branches.

    Args:
        store: an open store; the definitions deployed already.
        definitions: the deployed definitions (the patterns' are picked out).
        app: the example handlers.

    Returns:
        How each task ended.

    Raises:
        TimeoutError: the tasks had not all ended within :data:`PATTERN_DEADLINE` seconds.
    """
    runnable = pattern_definitions(definitions)
    by_name = {definition.name: definition for definition in runnable}
    ids: list[tuple[str, int]] = []
    for name, inputs in PATTERNS.items():
        for task_id in await store.tasks.submit(by_name[name], inputs, tenant="patterns"):
            ids.append((name, task_id))
    worker = Worker(store, app, runnable, worker_id=f"demo-patterns:{socket.gethostname()}")
    stop = CancellationToken()
    supervisor = WorkflowSupervisor(worker, SupervisorConfig(concurrency=8, idle_backoff_max=0.2))
    outside = _OutsideWorld(store)
    with anyio.fail_after(PATTERN_DEADLINE):
        async with anyio.create_task_group() as group:
            group.start_soon(supervisor.run, stop)
            while not await outside.all_ended(ids):
                await outside.answer(ids)
                await anyio.sleep(0.1)
            stop.cancel()
    ended = []
    waited = 0
    for name, task_id in ids:
        task = await store.tasks.get(task_id)
        ended.append((name, task_id, task.state, task.result or task.error))
        events = await store.tasks.events(task_id)
        waited += any(e["kind"] == "waiting" and "branches" in (e["detail"] or {}) for e in events)
    return PatternRun(tuple(ended), outside.signals, outside.completions, waited)


class _OutsideWorld:
    """The approvers, the storage service and the release manager of the patterns."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.answered: set[tuple[int, str]] = set()
        self.signals = 0
        self.completions = 0

    async def all_ended(self, ids: list[tuple[str, int]]) -> bool:
        for _, task_id in ids:
            if (await self.store.tasks.get(task_id)).state not in TERMINAL_STATES:
                return False
        return True

    async def answer(self, ids: list[tuple[str, int]]) -> None:
        """Answer every branch that waits for the outside world and has no answer yet."""
        for name, task_id in ids:
            task = await self.store.tasks.get(task_id)
            for branch in await self.store.branches.of_task(task_id):
                key = (task_id, branch.name)
                if branch.status != "waiting" or key in self.answered:
                    continue
                self.answered.add(key)
                await self._answer(name, task.input, task_id, branch.name, branch.waits_for)

    async def _answer(
        self, name: str, task_input: Any, task_id: int, branch: str, waits: tuple[str, ...]
    ) -> None:
        tasks = self.store.tasks
        try:
            if name == "parallel-approvals" and "signal:approval" in waits:
                rejected = (task_input["request_id"], branch) == REJECTED
                payload = {"approved": not rejected, "by": f"{branch} lead"}
                await tasks.signal(task_id, "approval", payload, address=branch)
                self.signals += 1
            elif name == "ci-pipeline" and "signal:deploy-approved" in waits:
                payload = {"by": "release manager"}
                await tasks.signal(task_id, "deploy-approved", payload, address=branch)
                self.signals += 1
            elif name == "restore-files" and waits and waits[0].startswith("callback:"):
                file = task_input["files"][int(branch)]
                if file not in LOST_FILES:
                    token = waits[0].split(":", 1)[1]
                    await tasks.complete(token, result={"file": file, "restored": True})
                    self.completions += 1
        except (TaskTerminal, CallbackRefused):
            pass  # the task or the attempt ended meanwhile (a decided step, a timeout)
