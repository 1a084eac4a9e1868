"""Golden histories of every example definition and every step kind, crashes included.

Each scenario drives tasks through a real worker in this process (and, for a crash, a
worker that dies mid-call or a claim that is never followed by a write), then compares every
commit of every task — state, checkpoint, events, evidence — with its file under
``tests/corpus/golden/`` (see ``tests/helpers/golden.py``; the scenarios are in
``tests/engine/golden/``). The files pin what a task's progress looks like at every
commit, so a change to the interpreter that alters resumption shows as a diff; they
change only deliberately (``TOOLKIT_GOLDEN_UPDATE=1``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from tests.apps import golden as golden_app
from tests.engine.golden.features import JOURNEY
from tests.engine.golden.steps import EXHAUSTED, FAILING_BRANCH, MAP, PARALLEL, PURE, RACE, RETRIES
from tests.helpers.golden import (
    EXAMPLES,
    GOLDEN,
    SCENARIOS,
    Run,
    compare,
    history,
    install_recorder,
)
from tests.helpers.inprocess import sql
from toolkit.application import App
from toolkit.examples import app as examples_app
from toolkit.store import Store

#: The recorder is a trigger on the tasks' and branches' tables, which a table distributed
#: by Citus cannot have; the histories pin the interpreter, whatever holds the rows.
pytestmark = [pytest.mark.anyio, pytest.mark.one_postgresql]


# --- the test (every scenario is registered by importing tests.engine.golden) ------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_golden_history(
    store: Store, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # files a scenario's handlers read or write, by relative path
    await install_recorder(store)
    func, app = SCENARIOS[name]
    golden_app.CALLBACKS.clear()
    golden_app.HUNG.clear()
    await func(Run(store, app))
    compare(name, await history(store))


# --- an old checkpoint still resumes ------------------------------------------------------

#: Scenarios whose tasks a worker finishes alone once they are due (no signal, completion or
#: crash to replay): their handlers and definitions.
RESUMABLE: dict[str, tuple[App, list[str | Path]]] = {
    "effect_retries_and_catch": (golden_app.app, [RETRIES, EXHAUSTED]),
    "pure_steps": (golden_app.app, [PURE]),
    "journey": (golden_app.app, [JOURNEY]),
    "fanout": (golden_app.app, [PARALLEL, FAILING_BRANCH, RACE, MAP]),
    "example_order_saga": (examples_app, [EXAMPLES / "order-saga.yaml"]),
    "example_order_saga_compensated": (examples_app, [EXAMPLES / "order-saga-compensated.yaml"]),
    "example_batch_map": (examples_app, [EXAMPLES / "batch-map.yaml"]),
    "example_research_race": (examples_app, [EXAMPLES / "research-race.yaml"]),
    "example_poll_loop": (examples_app, [EXAMPLES / "poll-loop.yaml"]),
}


def resume_points() -> list[tuple[str, str, int]]:
    """(scenario, task, commit) of every stored checkpoint between two cycles."""
    points = []
    for name in sorted(RESUMABLE):
        path = GOLDEN / f"{name}.json"
        if not path.exists():  # a new scenario: its history test writes the file first
            continue
        golden = json.loads(path.read_text())
        for task, recorded in golden.items():
            for index, commit in enumerate(recorded["commits"]):
                if index and commit.get("state") in ("queued", "waiting"):
                    points.append((name, task, index))
    return points


@pytest.mark.parametrize(("name", "task", "index"), resume_points())
async def test_a_stored_checkpoint_resumes_as_its_golden_history_goes_on(
    store: Store, name: str, task: str, index: int
) -> None:
    """The checkpoint a golden history holds at a commit between two cycles, put into a task
    of a fresh store, resumes into exactly the commits that followed it. A checkpoint format
    change must keep these passing (through a migration of old checkpoints)."""
    app, sources = RESUMABLE[name]
    recorded = json.loads((GOLDEN / f"{name}.json").read_text())[task]
    commit = recorded["commits"][index]
    await install_recorder(store)
    run = Run(store, app)
    by_name = {f"{d.name}@{d.version}": d for d in await run.deploy(*sources)}
    d = by_name[recorded["definition"]]
    task_id = int(task.split()[1])
    await sql(store, "INSERT INTO toolkit_tenants (tenant) VALUES (%s) ON CONFLICT DO NOTHING",
              recorded["tenant"])  # fmt: skip
    await sql(
        store,
        "INSERT INTO toolkit_tasks (id, tenant, definition_name, definition_version,"
        " definition_digest, input, checkpoint, state, wait_reason, lease_token, run_at)"
        " OVERRIDING SYSTEM VALUE"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, clock_timestamp())",
        task_id, recorded["tenant"], d.name, d.version, d.digest, Jsonb(recorded["input"]),
        Jsonb(commit["checkpoint"]), commit["state"], commit.get("wait_reason"),
        commit["token"],
    )  # fmt: skip
    await run.drain()
    while await run.state(task_id) == "waiting":
        await run.due(task_id)
        await run.drain()
    resumed = (await history(store))[task]["commits"][1:]
    assert json.dumps(resumed, indent=1, sort_keys=True, default=str) == json.dumps(
        recorded["commits"][index + 1 :], indent=1, sort_keys=True, default=str
    )
