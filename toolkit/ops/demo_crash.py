"""The demo's crash: a worker dies mid-charge, the next recovers, an operator reconciles.

:func:`crash_a_worker` runs a real worker process (``toolkit run``) with a fault armed after
the call of ``payments.charge`` and before its outcome is recorded (``faults.POINTS``), with
a short lease. It exits as a crash would, holding leases. The next worker takes those tasks
over once their leases expire; the charge whose outcome was lost is not called again: its
task waits for reconciliation (it fails closed, DESIGN §2). :func:`reconcile_charges` then
does what an operator would: it looks up the payment by the call's idempotency key in the
payment outbox, and records what it finds.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from toolkit import faults
from toolkit.examples.orders import outbox_by_key, payment_result
from toolkit.store import Store

#: The step whose outcome the crash loses.
CHARGE_STEP = "charge"
#: Lease of the crashing worker, seconds: short, so that the next worker soon takes over.
CRASH_LEASE = 2.0
#: Seconds the crashing worker may run before the demo stops it (it crashes long before).
CRASH_DEADLINE = 120.0


@dataclasses.dataclass(frozen=True)
class Crash:
    """How the crashing worker ended.

    Attributes:
        worker_id: its worker id.
        crashed: True when it exited at the armed fault (else it was stopped at the deadline).
        exit_code: its exit status.
    """

    worker_id: str
    crashed: bool
    exit_code: int


@dataclasses.dataclass(frozen=True)
class Reconciliation:
    """What the operator found for one uncertain charge, and recorded.

    Attributes:
        task_id: the task.
        occurrence: the step occurrence whose outcome was lost (``charge#1``).
        payment_id: the payment found in the outbox, or None (the call did not get through).
        outcome: ``completed`` (the payment stands, recorded as the step's result) or
            ``retry`` (no payment: the charge is called again).
    """

    task_id: int
    occurrence: str
    payment_id: str | None
    outcome: str


def crash_a_worker(dsn: str, definitions_dir: Path, *, concurrency: int) -> Crash:
    """Run ``toolkit run`` with a fault after the first charge call, until it exits.

    Args:
        dsn: the store's DSN (the worker process connects on its own).
        definitions_dir: the definitions it runs.
        concurrency: its cycles in flight at most.

    Returns:
        How it ended.
    """
    worker_id = f"demo-crashing:{os.getpid()}"
    env = {
        **os.environ,
        "TOOLKIT_FAULT_POINT": "after_call",
        "TOOLKIT_FAULT_STEP": CHARGE_STEP,
        "TOOLKIT_LOG_LEVEL": "ERROR",
    }
    command = [
        sys.executable, "-m", "toolkit", "--dsn", dsn, "run", "--app", "toolkit.examples",
        "--definitions", str(definitions_dir), "--concurrency", str(concurrency),
        "--lease", str(CRASH_LEASE), "--heartbeat", str(CRASH_LEASE / 4),
        "--worker-id", worker_id, "--summary-every", "0",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        code = process.wait(timeout=CRASH_DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    return Crash(worker_id, code == faults.FAULT_EXIT_CODE, code)


async def reconcile_charges(store: Store, task_ids: Iterable[int]) -> list[Reconciliation]:
    """Reconcile every task of ``task_ids`` waiting on an uncertain charge, from the outbox.

    A payment request in the outbox under the call's idempotency key means the charge got
    through: it is recorded as the step's result (``completed``), so the customer is not
    charged twice. No request means it did not: the charge is called again (``retry``).

    Returns:
        What was found and recorded, per task.
    """
    done: list[Reconciliation] = []
    for task_id in task_ids:
        task = await store.tasks.get(task_id)
        pending = task.checkpoint.get("pending")
        if task.wait_reason != "reconciliation" or not pending:
            continue
        started = [
            record
            for record in await store.tasks.evidence(task_id)
            if record["occurrence"] == pending and record["record"] == "started"
        ]
        key = started[-1]["idempotency_key"]
        async with store.db.connection() as conn:
            found = await outbox_by_key(conn, key)
        if found is None:
            await store.tasks.reconcile(task_id, CHARGE_STEP, "retry", operator="demo")
            done.append(Reconciliation(task_id, str(pending), None, "retry"))
            continue
        result = payment_result(*found)
        await store.tasks.reconcile(
            task_id, CHARGE_STEP, "completed", result=result, operator="demo"
        )
        done.append(Reconciliation(task_id, str(pending), result["payment_id"], "completed"))
    return done
