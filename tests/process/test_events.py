"""Events across real worker processes: 100 emits with 10 repeated event keys start 90 tasks,
none twice, while two `toolkit run` workers serve them and one is SIGKILLed mid-run."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from tests.helpers.processes import call_counts, query, toolkit_process, wait_for
from tests.helpers.workflows import definition
from toolkit.store import Store

RUN = ["run", "--app", "tests.apps.counting", "--lease", "2", "--heartbeat", "0.5"]

PLACED = """
name: placed
version: 1
input: {type: object, required: [order_id]}
triggers:
  - event: order.placed
    input: {order_id: "${ event.order_id }"}
    key: "${ event.order_id }"
start: work
steps:
  work: {effect: count.work, idempotent: true, args: {seconds: 0.05}, next: done}
  done: {succeed: {output: "${ input.order_id }"}}
"""


def emit_all(dsn: str, orders: Sequence[str]) -> list[Any]:
    """Emit order.placed for each order, its event key the order id."""

    async def main() -> list[Any]:
        async with await Store.open(dsn, migrate_schema=False) as store:
            await store.definitions.deploy(definition(PLACED))
            return [
                await store.events.emit("order.placed", {"order_id": o}, key=f"placed-{o}")
                for o in orders
            ]

    return anyio.run(main)


def succeeded(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM toolkit_tasks WHERE state = 'succeeded'")[0][0])  # type: ignore[call-overload]


def test_emits_with_repeated_keys_start_each_task_once_across_a_worker_crash(
    dsn: str, tmp_path: Path
) -> None:
    path = tmp_path / "placed.yaml"
    path.write_text(PLACED)
    orders = [f"o-{n}" for n in range(90)]
    first = emit_all(dsn, orders[:60])
    a = toolkit_process(dsn, *RUN, "--definitions", str(path), "--worker-id", "A")
    b = toolkit_process(dsn, *RUN, "--definitions", str(path), "--worker-id", "B")
    try:
        wait_for(lambda: succeeded(dsn) >= 20, what="20 tasks succeeded")
        a.send_signal(signal.SIGKILL)
        a.communicate(timeout=10)
        # The rest, and 10 repeats of keys emitted before the crash, after it.
        second = emit_all(dsn, [*orders[60:], *orders[:10]])
        wait_for(lambda: succeeded(dsn) == 90, timeout=90, what="90 tasks succeeded")
    finally:
        b.send_signal(signal.SIGTERM)
        b.communicate(timeout=30)
        if a.poll() is None:
            a.kill()
    assert [e.duplicate for e in first + second] == [False] * 90 + [True] * 10
    rows = query(dsn, "SELECT idempotency_key, state, result FROM toolkit_tasks ORDER BY id")
    assert len(rows) == 90, rows
    assert sorted(str(key) for key, _, _ in rows) == sorted(f"placed:{o}" for o in orders)
    assert {state for _, state, _ in rows} == {"succeeded"}, rows
    calls = call_counts(dsn)
    # Each task's effect ran once, or twice for those in flight when A died (same key).
    assert all(1 <= calls.get(f"{n}:work#1", 0) <= 2 for n in range(1, 91)), calls
    events = query(dsn, "SELECT count(*), sum(cardinality(started)) FROM toolkit_events")
    assert events == [(90, 90)], events
