"""Golden histories: every commit of a task, recorded by the database, compared with a file.

A trigger (installed in the test's own database only, never by the toolkit) records the
task row after every insert or update that changes its state or checkpoint, with the ids
of the newest event and evidence row at that moment; another records every write of a
branch row (the branches of a parallel or map step have rows of their own). A history is
then, per task, the list of its commits: state, wait reason, checkpoint, where its
branches stood, and the events and evidence each commit appended. It is normalised for
what legitimately varies between runs (times, callback tokens, retry jitter, claim delays,
the scenario's working folder) and compared with
``tests/corpus/golden/NAME.json``.

A golden file changes only deliberately: run the tests with ``TOOLKIT_GOLDEN_UPDATE=1`` to
write the files again, and explain the diff in the commit.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from tests.apps import golden as golden_app
from tests.helpers.inprocess import FAST, expire_leases, make_due, sql
from tests.helpers.processes import eventually
from tests.helpers.workflows import definition
from toolkit.application import App
from toolkit.definition import WorkflowDefinition, load_definition
from toolkit.runtime.supervisor import CancellationToken, SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

GOLDEN = Path(__file__).resolve().parent.parent / "corpus" / "golden"
UPDATE = os.environ.get("TOOLKIT_GOLDEN_UPDATE") == "1"

RECORDER = """
CREATE TABLE golden_commits (
    seq bigserial PRIMARY KEY,
    task_id bigint NOT NULL,
    state text NOT NULL,
    wait_reason text,
    token bigint,
    checkpoint jsonb,
    events_upto bigint NOT NULL,
    evidence_upto bigint NOT NULL,
    txid bigint NOT NULL DEFAULT txid_current()
);
CREATE TABLE golden_branches (
    seq bigserial PRIMARY KEY,
    task_id bigint NOT NULL,
    fanout text NOT NULL,
    name text NOT NULL,
    frame jsonb NOT NULL,
    txid bigint NOT NULL DEFAULT txid_current()
);
CREATE FUNCTION golden_record_branch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO golden_branches (task_id, fanout, name, frame)
    VALUES (NEW.task_id, NEW.fanout, NEW.name, NEW.frame);
    RETURN NULL;
END $$;
CREATE TRIGGER golden_record_branch AFTER INSERT OR UPDATE ON toolkit_branches
    FOR EACH ROW EXECUTE FUNCTION golden_record_branch();
CREATE FUNCTION golden_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state
       OR NEW.checkpoint IS DISTINCT FROM OLD.checkpoint THEN
        INSERT INTO golden_commits
            (task_id, state, wait_reason, token, checkpoint, events_upto, evidence_upto)
        VALUES (NEW.id, NEW.state, NEW.wait_reason, NEW.lease_token, NEW.checkpoint,
                (SELECT coalesce(max(id), 0) FROM toolkit_task_events WHERE task_id = NEW.id),
                (SELECT coalesce(max(id), 0) FROM toolkit_effect_evidence
                 WHERE task_id = NEW.id));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER golden_record AFTER INSERT OR UPDATE ON toolkit_tasks
    FOR EACH ROW EXECUTE FUNCTION golden_record();
"""

_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{2}:?\d{2}|Z)?$")
_CALLBACK = re.compile(r"cb_[A-Za-z0-9_-]{16,}")
_EVIDENCE_FIELDS = (
    "occurrence", "step", "handler", "idempotent", "key", "record", "attempt", "token",
    "worker", "result", "error", "spend",
)
#: Keys whose values vary from run to run by design: retry jitter and claim delays.
_VARYING = {"delay_seconds", "queue_delay"}


async def install_recorder(store: Store) -> None:
    """Start recording every commit of every task of this (test) database."""
    async with store.db.connection() as conn:
        await conn.execute(RECORDER)  # type: ignore[arg-type]


class _Normaliser:
    """Replaces what varies between runs with stable placeholders (callback tokens numbered
    in order of appearance)."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.folder = os.getcwd()  # the scenario's own working folder

    def __call__(self, value: Any, key: str | None = None) -> Any:
        if key in _VARYING and value is not None:
            return "<varies>"
        if isinstance(value, dict):
            out = {k: self(v, k) for k, v in value.items()}
            if str(out.get("path", "")).startswith("<folder>") and "sha256" in out:
                if out["path"].endswith(".json"):  # a report that names its source's path
                    out.update(bytes="<varies>", sha256="<varies>")
            return out
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str):
            if _TIME.match(value):
                return "<time>"
            return _CALLBACK.sub(self._token, value.replace(self.folder, "<folder>"))
        return value

    def _token(self, match: re.Match[str]) -> str:
        return self.tokens.setdefault(match.group(0), f"<callback-{len(self.tokens) + 1}>")


async def history(store: Store) -> dict[str, dict[str, Any]]:
    """Every task's commits, oldest first, normalised.

    Returns:
        ``{"task N": {"definition": "NAME@VERSION", "tenant", "input", "commits": [...]}}``.
    """
    async with store.db.connection() as conn:
        commits = await (
            await conn.execute(
                "SELECT task_id, state, wait_reason, token, checkpoint, events_upto,"
                " evidence_upto, txid FROM golden_commits ORDER BY seq"
            )
        ).fetchall()
        events = await (
            await conn.execute(
                "SELECT task_id, id, kind, worker_id, fencing_token, detail"
                " FROM toolkit_task_events ORDER BY id"
            )
        ).fetchall()
        rows = await (
            await conn.execute(
                "SELECT id, definition_name, definition_version, tenant, input"
                " FROM toolkit_tasks ORDER BY id"
            )
        ).fetchall()
        branch_writes = await (
            await conn.execute(
                "SELECT task_id, fanout, name, frame, txid FROM golden_branches ORDER BY seq"
            )
        ).fetchall()
        evidence = await (
            await conn.execute(
                "SELECT task_id, id, occurrence, step, handler, idempotent, idempotency_key,"
                " record, attempt, fencing_token, worker_id, result, error, spend"
                " FROM toolkit_effect_evidence ORDER BY id"
            )
        ).fetchall()
        callbacks = await (
            await conn.execute(
                "SELECT token FROM toolkit_callbacks ORDER BY task_id, occurrence, attempt, token"
            )
        ).fetchall()
    normalise = _Normaliser()
    # Numbered by task and step occurrence, not by first appearance: concurrent branches
    # create their callbacks in an order that depends on timing (a flaky golden in CI).
    for (token,) in callbacks:
        normalise(token)
    tasks: dict[str, list[dict[str, Any]]] = {}
    seen_events: dict[int, int] = {}
    seen_evidence: dict[int, int] = {}
    for task_id, state, wait_reason, token, checkpoint, events_upto, evidence_upto, txid in commits:
        since_event = seen_events.get(task_id, 0)
        since_evidence = seen_evidence.get(task_id, 0)
        seen_events[task_id] = events_upto
        seen_evidence[task_id] = evidence_upto
        commit: dict[str, Any] = {"state": state}
        if wait_reason is not None:
            commit["wait_reason"] = wait_reason
        commit["token"] = token
        commit["events"] = [
            {"kind": kind, "worker": worker, "token": fencing, "detail": detail}
            for tid, eid, kind, worker, fencing, detail in events
            if tid == task_id and since_event < eid <= events_upto
        ]
        recorded = [
            dict(zip(_EVIDENCE_FIELDS, row[2:], strict=True))
            for row in evidence
            if row[0] == task_id and since_evidence < row[1] <= evidence_upto
        ]
        if recorded:
            commit["evidence"] = recorded
        commit["checkpoint"] = checkpoint
        fanout = (checkpoint or {}).get("fanout")
        if fanout is not None:  # where every branch stood at this commit
            branches: dict[str, Any] = {}
            for tid, occurrence, name, frame, written in branch_writes:
                if tid == task_id and occurrence == fanout["occurrence"] and written <= txid:
                    branches[name] = frame
            commit["branches"] = branches
        tasks.setdefault(f"task {task_id}", []).append(normalise(commit))
    for name, commits in tasks.items():
        tasks[name] = _collapse_fanouts(commits)
    # Events written without a state or checkpoint change (signals received, callbacks
    # completed, cancel requests) ride with the task's next commit; the ones after the last
    # commit are listed on their own.
    for task_id, last in seen_events.items():
        tail = [
            normalise({"kind": kind, "worker": worker, "token": fencing, "detail": detail})
            for tid, eid, kind, worker, fencing, detail in events
            if tid == task_id and eid > last
        ]
        if tail:
            tasks[f"task {task_id}"].append({"events after the last commit": tail})
    return {
        f"task {task_id}": {
            "definition": f"{name}@{version}",
            "tenant": tenant,
            "input": value,
            "commits": tasks[f"task {task_id}"],
        }
        for task_id, name, version, tenant, value in rows
        if f"task {task_id}" in tasks
    }


def _collapse_fanouts(commits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each fan-out phase of one lease as one entry, its events and evidence as multisets.

    While a parallel or map step runs its branches concurrently inside one lease, how their
    progress is grouped into commits depends on timing (a database reply may be handled
    before or after another branch's next step), so the commits of such a phase are
    compared as sets: what was appended in the phase, and where every branch stood at its
    end. The write ids of the lease (which count its commits) are left out.
    """
    out: list[dict[str, Any]] = []
    for commit in commits:
        checkpoint = commit.get("checkpoint") or {}
        if isinstance(checkpoint.get("write"), str):
            checkpoint["write"] = checkpoint["write"].split(":")[0] + ":<n>"
        phase = out[-1].get("fan-out phase") if out else None
        if checkpoint.get("fanout") is None or commit["state"] != "leased":
            out.append(commit)
            continue
        if phase is None or phase["token"] != commit["token"]:
            phase = {"token": commit["token"], "events": [], "evidence": []}
            out.append({"fan-out phase": phase})
        phase["events"] = _sorted([*phase["events"], *commit["events"]])
        phase["evidence"] = _sorted([*phase["evidence"], *commit.get("evidence", [])])
        phase["branches at its end"] = commit.get("branches", {})
        phase["checkpoint at its end"] = {k: v for k, v in checkpoint.items() if k != "fanout"}
    return out


def _sorted(items: list[Any]) -> list[Any]:
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True, default=str))


def compare(name: str, actual: Any) -> None:
    """Assert that ``actual`` is the golden history ``name`` (or write it, when updating)."""
    path = GOLDEN / f"{name}.json"
    text = json.dumps(actual, indent=1, sort_keys=True, default=str) + "\n"
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not UPDATE:
            raise AssertionError(f"no golden history {path.name} yet: written, check it in")
        return
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"golden/{path.name}",
                tofile="this run",
                n=4,
            )
        )
        raise AssertionError(f"the history differs from golden/{path.name}:\n{diff[:12000]}")


# --- the scenarios' harness: a run of workers, and the registry of scenarios ------------------

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "definitions"
#: Seconds a scenario's worker may take to run out of due work (a hang fails the test).
DRAIN_DEADLINE = 60.0


class Run:
    """One scenario's store, definitions and workers."""

    def __init__(self, store: Store, app: App) -> None:
        self.store = store
        self.app = app
        self.definitions: dict[str, WorkflowDefinition] = {}

    async def deploy(self, *sources: str | Path) -> list[WorkflowDefinition]:
        loaded = []
        for source in sources:
            d = load_definition(source) if isinstance(source, Path) else definition(source)
            await self.store.definitions.deploy(d)
            self.definitions[d.digest] = d
            loaded.append(d)
        return loaded

    async def submit(self, d: WorkflowDefinition, *inputs: Any, **options: Any) -> list[int]:
        return await self.store.tasks.submit(d, list(inputs), **options)

    def worker(self, worker_id: str) -> Worker:
        return Worker(self.store, self.app, list(self.definitions.values()), worker_id=worker_id)

    async def drain(self, worker_id: str = "golden-1", **config: Any) -> None:
        """Run a worker until nothing is due now."""
        settings = {**FAST, "concurrency": 1, **config, "until_idle": True}
        supervisor = WorkflowSupervisor(self.worker(worker_id), SupervisorConfig(**settings))
        try:
            with anyio.fail_after(DRAIN_DEADLINE):
                await supervisor.run()
        except TimeoutError:
            raise AssertionError(
                f"the worker did not run out of due work in {DRAIN_DEADLINE:g} s:\n"
                + await self.stuck_state()
            ) from None

    async def stuck_state(self) -> str:
        """What a drain that never idled leaves: the live tasks, the tenants' rotation, what
        the idle check says, and the locks held by other sessions (for the failure)."""
        tasks = await sql(
            self.store,
            "SELECT id, tenant, state, wait_reason, run_at, lease_owner, lease_expires_at,"
            " clock_timestamp() FROM toolkit_tasks WHERE state IN ('queued', 'leased',"
            " 'waiting') ORDER BY id",
        )
        tenants = await sql(
            self.store, "SELECT tenant, ready, paused, vtime, next_due FROM toolkit_tenants"
        )
        idle = await self.store.tasks.idle_state(list(self.definitions))
        locks = await sql(
            self.store,
            "SELECT a.pid, a.state, a.xact_start, left(a.query, 120), l.relation::regclass,"
            " l.mode, l.granted FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
            " AND l.locktype IN ('relation', 'tuple', 'transactionid')",
        )
        lines = [
            f"  tasks: {tasks}",
            f"  tenants: {tenants}",
            f"  idle_state (pending, next_due): {idle}",
            f"  other sessions' locks: {locks}",
        ]
        return "\n".join(lines)

    async def due(self, *task_ids: int) -> None:
        for task_id in task_ids:
            await make_due(self.store, task_id)

    async def ghost_claim(self, task_id: int) -> None:
        """A worker claims the task and dies before writing anything (its lease expires)."""
        (claimed,) = await self.store.leases.claim("ghost", list(self.definitions), 1, 30.0)
        assert claimed.id == task_id, claimed
        await expire_leases(self.store, task_id)

    async def crash_mid_call(
        self,
        task_id: int,
        worker_id: str = "golden-crashed",
        also: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """A worker runs the task into ``golden.hang_once`` and dies there (lease taken over).

        The worker stops claiming once the call hangs (and ``also`` holds, when given: a
        store condition the crash must come after), its lease is expired by row surgery,
        and its heartbeat then finds the lease gone: its cycle ends without a write. (Every
        write the cycle makes before a call is applied before the call: none is in flight.)
        """
        hung = len(golden_app.HUNG)
        shutdown = CancellationToken()
        supervisor = WorkflowSupervisor(
            self.worker(worker_id), SupervisorConfig(**{**FAST, "concurrency": 1, "grace": 60.0})
        )
        with anyio.fail_after(DRAIN_DEADLINE):
            async with anyio.create_task_group() as group:
                group.start_soon(supervisor.run, shutdown)
                await eventually(
                    lambda: _hung_more_than(hung), timeout=15, what="a call to hang"
                )
                if also is not None:
                    await eventually(also, timeout=15, what="the condition before the crash")
                shutdown.cancel()  # claims nothing more; the hung cycle keeps its grace
                await expire_leases(self.store, task_id)
        assert supervisor.report.lease_lost == 1, supervisor.report

    async def state(self, task_id: int) -> str:
        return (await self.store.tasks.get(task_id)).state

    async def open_callback(self, task_id: int) -> str:
        rows = await sql(
            self.store,
            "SELECT token FROM toolkit_callbacks WHERE task_id = %s AND state = 'open'",
            task_id,
        )
        ((token,),) = rows
        return str(token)


async def _hung_more_than(count: int) -> bool:
    return len(golden_app.HUNG) > count


Scenario = Callable[[Run], Awaitable[None]]
SCENARIOS: dict[str, tuple[Scenario, App]] = {}


def scenario(app: App = golden_app.app) -> Callable[[Scenario], Scenario]:
    def register(func: Scenario) -> Scenario:
        SCENARIOS[func.__name__] = (func, app)
        return func

    return register
