"""The raw floor: the least SQL doing the engine's durable work, with nothing around it.

On the toolkit's own tables, ``concurrency`` connections (one thread each) repeat: claim a
batch with ``FOR UPDATE SKIP LOCKED`` (the engine's claim predicate, fencing token + 1), then
for every write of the protocol one fenced UPDATE per task (guarded by id + owner + token +
state + unexpired lease), the last of which completes the task. The checkpoints written are
the engine's own, serialised once up front, so no Python work happens between statements
beyond the driver's.

The write schedule is the engine's: one checkpoint per step, the last one completing the
task; a non-idempotent chain also writes its first intent before the first call (every
later intent rides on the previous step's checkpoint), so ``steps + 1`` writes per task.

Modes (how one batch's writes reach the server):

- ``unnest``: one ``UPDATE ... FROM unnest(ids, tokens)`` per write: a commit per batch-write.
- ``pipeline``: ``executemany`` of the per-row UPDATE in pipeline mode: one round trip and
  one (implicit) transaction per batch-write.
- ``commit-per-write``: the per-row UPDATE pipelined with a Sync after each, so every
  task-write is its own transaction, like the engine's one fenced statement per write.
- ``engine-sql`` (a diagnostic, not a floor): the statements a worker sends on one tenant's
  queue, ``claim_tasks_one_tenant`` and ``commit_step`` (its group commit of such writes:
  each keeps the lease or ends a task whose end does nothing more), one per batch-write,
  with the engine's parameters (evidence records and events included), on a connection
  set as the worker's that plans once: the engine minus its Python.

Run: ``.venv/bin/python bench/raw_floor.py [--dsn DSN] [--tasks N] [--steps S]
[--non-idempotent] [--concurrency C] [--batch B] [--mode M]``; with ``--seeded DSN`` it
drains that database, seeded already (``bench.workload.seed``), in the one mode given, and
prints ``processed N`` (the peer harness runs the floor so, as a process of its own).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, LiteralString

if __package__ in {None, ""}:  # run as a script: make `bench` and `toolkit` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from bench.noop_app import NOOP_HANDLER
from bench.workload import Workload, bench_server, scratch_database, seed, task_states
from toolkit.checkpoint import Checkpoint
from toolkit.store import rotation
from toolkit.store.database import PLAN_ONCE_SETTINGS, SESSION_SETTINGS
from toolkit.store.fence import Fence
from toolkit.store.queries import query
from toolkit.store.writes import Event, FencedWrite, write_json

Mode = Literal["unnest", "pipeline", "commit-per-write", "engine-sql"]
#: The floor proper: the minimal SQL, batched three ways.
FLOOR_MODES: tuple[Mode, ...] = ("unnest", "pipeline", "commit-per-write")
MODES: tuple[Mode, ...] = (*FLOOR_MODES, "engine-sql")
LEASE_SECONDS = 30.0
#: Stands for the task id in a write's evidence records (their idempotency keys).
TASK_ID = "@task@"
#: The seeded tasks' tenant (the one ``submit`` gives by default).
TENANT = "default"

CLAIM: LiteralString = """
UPDATE toolkit_tasks t
SET state = 'leased', lease_owner = %(worker_id)s, lease_token = t.lease_token + 1,
    lease_expires_at = statement_timestamp() + %(lease_seconds)s * interval '1 second',
    attempts = t.attempts + 1, updated_at = statement_timestamp()
FROM (SELECT id FROM toolkit_tasks
      WHERE state IN ('queued', 'leased') AND run_at <= statement_timestamp()
        AND (state = 'queued' OR lease_expires_at <= statement_timestamp())
        AND definition_digest = ANY(%(digests)s::text[])
      ORDER BY run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
WHERE t.id = c.id
RETURNING t.id, t.lease_token
"""

# Per-row statements, positional: (checkpoint, id, owner, token).
ROW_CHECKPOINT: LiteralString = """
UPDATE toolkit_tasks SET checkpoint = %s::jsonb, updated_at = statement_timestamp()
WHERE id = %s AND lease_owner = %s AND lease_token = %s
  AND state = 'leased' AND lease_expires_at > statement_timestamp()
"""
ROW_COMPLETE: LiteralString = """
UPDATE toolkit_tasks
SET checkpoint = %s::jsonb, state = 'succeeded', result = '{}', lease_owner = NULL,
    lease_expires_at = NULL, finished_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE id = %s AND lease_owner = %s AND lease_token = %s
  AND state = 'leased' AND lease_expires_at > statement_timestamp()
"""
# Set statements, positional: (checkpoint, ids, tokens, owner).
SET_CHECKPOINT: LiteralString = """
UPDATE toolkit_tasks t SET checkpoint = %s::jsonb, updated_at = statement_timestamp()
FROM unnest(%s::bigint[], %s::bigint[]) AS h(id, token)
WHERE t.id = h.id AND t.lease_token = h.token AND t.lease_owner = %s
  AND t.state = 'leased' AND t.lease_expires_at > statement_timestamp()
"""
SET_COMPLETE: LiteralString = """
UPDATE toolkit_tasks t
SET checkpoint = %s::jsonb, state = 'succeeded', result = '{}', lease_owner = NULL,
    lease_expires_at = NULL, finished_at = statement_timestamp(), updated_at = statement_timestamp()
FROM unnest(%s::bigint[], %s::bigint[]) AS h(id, token)
WHERE t.id = h.id AND t.lease_token = h.token AND t.lease_owner = %s
  AND t.state = 'leased' AND t.lease_expires_at > statement_timestamp()
"""


@dataclasses.dataclass(frozen=True)
class Write:
    """One fenced write of the protocol, serialised once.

    Attributes:
        checkpoint: the checkpoint JSON the engine writes here.
        final: the write completes the task.
        records: the engine's evidence records of this write (JSON, ``TASK_ID`` in keys).
        engine: the engine's ``commit_step`` write of one task, built by the engine's own
            code, but for the task, token and evidence records.
    """

    checkpoint: str
    final: bool
    records: str
    engine: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class FloorResult:
    """One floor run."""

    mode: str
    tasks: int
    steps: int
    writes: int
    wall: float

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall


class LeaseLostError(RuntimeError):
    """A fenced write of the floor applied to fewer rows than it held."""


def write_plan(workload: Workload) -> list[Write]:
    """The writes the engine makes for one task of ``workload``, in order.

    Before calling a non-idempotent step the engine writes its attempt and pending intent
    with a ``started`` record (an idempotent attempt is not written before its call); the
    ``completed`` record of a step rides on the next write; after the last step the cursor
    is None.
    """
    ids = workload.step_ids()
    checkpoint = Checkpoint.initial(ids[0])
    plan: list[Write] = []
    records: list[dict[str, Any]] = []

    def record(step: str, kind: str, result: Any = None) -> dict[str, Any]:
        occurrence = checkpoint.occurrence(step)
        return {
            "occurrence": occurrence, "step": step, "handler": NOOP_HANDLER,
            "idempotent": workload.idempotent, "idempotency_key": f"{TASK_ID}:{occurrence}",
            "record": kind, "attempt": 1, "result": result, "error": None,
        }  # fmt: skip

    def begin(step: str) -> None:
        if not workload.idempotent:
            checkpoint.attempts[checkpoint.occurrence(step)] = 1
            checkpoint.pending = checkpoint.occurrence(step)
            records.append(record(step, "started"))

    def flush(final: bool) -> None:
        state = json.dumps(checkpoint.to_json())  # a snapshot: the checkpoint moves on
        fenced = FencedWrite(
            fence=Fence("", 0, TENANT, 0), checkpoint=json.loads(state),
            state="succeeded" if final else "leased", result={} if final else None,
            events=(Event("succeeded"),) if final else (),
        )  # fmt: skip
        plan.append(Write(state, final, json.dumps(records), write_json(fenced, lean=True)))
        records.clear()

    begin(ids[0])
    if records:
        flush(final=False)
    for step, following in zip(ids, [*ids[1:], None], strict=True):
        records.append(record(step, "completed", result={}))
        checkpoint.attempts.pop(checkpoint.occurrence(step), None)
        checkpoint.pending = None
        checkpoint.outputs[step] = {}
        checkpoint.enter(following)
        if following is not None:
            begin(following)
        flush(final=following is None)
    return plan


Claimed = Sequence[tuple[int, int]]
Connection = psycopg.Connection[Any]


@dataclasses.dataclass(frozen=True)
class Worker:
    """One floor connection's identity and what it claims."""

    owner: str
    digest: str
    batch: int

    def claim_params(self) -> dict[str, Any]:
        return {
            "worker_id": self.owner,
            "digests": [self.digest],
            "limit": self.batch,
            "lease_seconds": LEASE_SECONDS,
            "deferring": False,
            "locked": [],  # the engine's claim: no limited tenant locked (the one-statement path)
            "window": rotation.window(self.batch),
            "per_tenant": rotation.per_tenant(self.batch),
            "tenant": None,
        }


def _claim_minimal(conn: Connection, worker: Worker) -> list[tuple[int, int]]:
    return conn.execute(CLAIM, worker.claim_params()).fetchall()


def _claim_engine(conn: Connection, worker: Worker) -> list[tuple[int, int]]:
    cursor = conn.cursor(row_factory=dict_row)
    params = {**worker.claim_params(), "tenant": TENANT}
    rows = cursor.execute(query("claim_tasks_one_tenant"), params).fetchall()
    return [(row["id"], row["lease_token"]) for row in rows if row["id"] is not None]


def _write_unnest(conn: Connection, claimed: Claimed, worker: Worker, write: Write) -> int:
    ids, tokens = zip(*claimed, strict=True)
    statement = SET_COMPLETE if write.final else SET_CHECKPOINT
    params = (write.checkpoint, list(ids), list(tokens), worker.owner)
    return conn.execute(statement, params).rowcount


def _write_pipeline(conn: Connection, claimed: Claimed, worker: Worker, write: Write) -> int:
    statement = ROW_COMPLETE if write.final else ROW_CHECKPOINT
    cursor = conn.cursor()  # executemany pipelines the rows and syncs once at the end
    cursor.executemany(statement, [(write.checkpoint, i, worker.owner, t) for i, t in claimed])
    return cursor.rowcount


def _write_commit_per_write(
    conn: Connection, claimed: Claimed, worker: Worker, write: Write
) -> int:
    statement = ROW_COMPLETE if write.final else ROW_CHECKPOINT
    with conn.pipeline() as pipeline:
        cursors = []
        for task_id, token in claimed:
            cursors.append(
                conn.execute(statement, (write.checkpoint, task_id, worker.owner, token))
            )
            pipeline.sync()
    return sum(cursor.rowcount for cursor in cursors)


def _write_engine_sql(conn: Connection, claimed: Claimed, worker: Worker, write: Write) -> int:
    """The engine's group commit: one ``commit_step`` statement for the claimed batch."""
    writes = [
        {
            **write.engine,
            "task_id": task_id,
            "token": token,
            "evidence": json.loads(write.records.replace(TASK_ID, str(task_id))),
        }
        for task_id, token in claimed
    ]
    cursor = conn.execute(
        query("commit_step"),
        {"worker_id": worker.owner, "writes": Jsonb(writes), "tenant": TENANT, "wake_within": None},
    )
    return cursor.rowcount


ClaimFn = Callable[[Connection, Worker], list[tuple[int, int]]]
WriteFn = Callable[[Connection, Claimed, Worker, Write], int]
STRATEGIES: dict[Mode, tuple[ClaimFn, WriteFn]] = {
    "unnest": (_claim_minimal, _write_unnest),
    "pipeline": (_claim_minimal, _write_pipeline),
    "commit-per-write": (_claim_minimal, _write_commit_per_write),
    "engine-sql": (_claim_engine, _write_engine_sql),
}


def _drain(dsn: str, plan: Sequence[Write], worker: Worker, mode: Mode) -> int:
    """Claim and finish batches on one connection until nothing is left; tasks finished."""
    claim, write = STRATEGIES[mode]
    finished = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        if mode == "engine-sql":  # as the worker's connections that plan once
            for setting in (*SESSION_SETTINGS, *PLAN_ONCE_SETTINGS):
                conn.execute(setting)
        while claimed := claim(conn, worker):
            for step_write in plan:
                if write(conn, claimed, worker, step_write) != len(claimed):
                    raise LeaseLostError(f"{worker.owner}: a fenced write missed a held lease")
            finished += len(claimed)
    return finished


def run_floor(
    dsn: str, workload: Workload, *, concurrency: int, batch: int, mode: Mode
) -> FloorResult:
    """Run every queued task of a seeded database to completion the raw-SQL way.

    Args:
        dsn: a database seeded with :func:`bench.workload.seed`.
        workload: what the tasks are (step count and idempotence).
        concurrency: connections working in parallel, one thread each.
        batch: tasks claimed per claim statement at most.
        mode: how a batch's writes are sent (see the module doc).

    Raises:
        LeaseLostError: a fenced write did not apply (never expected: nobody else claims).
    """
    plan = write_plan(workload)
    digest = workload.definition().digest
    finished = [0] * concurrency
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            finished[index] = _drain(dsn, plan, Worker(f"floor-{index}", digest, batch), mode)
        except BaseException as exc:
            errors.append(exc)  # re-raised in the caller's thread

    threads = [threading.Thread(target=work, args=(i,)) for i in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    tasks = sum(finished)
    return FloorResult(mode, tasks, tasks * workload.steps, tasks * len(plan), wall)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server DSN (default: a temporary embedded server)")
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--non-idempotent", action="store_true")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--mode", choices=MODES, action="append", help="default: all")
    parser.add_argument("--seeded", metavar="DSN", help="drain this seeded database (one mode)")
    args = parser.parse_args(argv)
    workload = Workload(args.steps, idempotent=not args.non_idempotent)
    if args.seeded is not None:
        if args.mode is None or len(args.mode) != 1:
            parser.error("--seeded drains in one --mode")
        result = run_floor(args.seeded, workload, concurrency=args.concurrency,
                           batch=args.batch, mode=args.mode[0])  # fmt: skip
        states = task_states(args.seeded)
        if result.tasks == 0 or set(states) != {"succeeded"}:
            sys.exit(f"--seeded: drained {result.tasks} tasks, states after {states} (are "
                     f"--steps and --non-idempotent the seeded workload's?)")  # fmt: skip
        print(f"processed {result.tasks} tasks in {result.wall:.6f} s")
        return
    with bench_server(args.dsn) as server:
        for mode in args.mode or MODES:
            with scratch_database(server, "bench_floor") as dsn:
                seed(dsn, workload, args.tasks)
                result = run_floor(
                    dsn, workload, concurrency=args.concurrency, batch=args.batch, mode=mode
                )
                states = task_states(dsn)
            print(
                f"{mode:>16}: {result.tasks} tasks, {result.steps} steps, {result.writes} "
                f"writes in {result.wall:.3f} s = {result.steps_per_second:,.0f} steps/s "
                f"(states {states})"
            )


if __name__ == "__main__":
    main()
