"""The demo's events: orders started by ``order.placed``, each waiting for its own payment.

``order-events`` (``definitions/order-events.yaml``) has a trigger on ``order.placed``,
waits for the ``payment.settled`` event of its own order and is cancelled by its
``order.cancelled`` (``cancel_on``). This
module plays the shop: it emits the orders (one twice with the same key, one of total 0
that its trigger's ``when`` skips), pays three of them before any worker ran, runs a
worker, then pays five more among twenty payments of other shops' orders and cancels the
last two, and runs the worker again. Every emit goes through ``store.events.emit``, as
``toolkit emit`` does.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterable

from toolkit.application import App
from toolkit.definition import WorkflowDefinition
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store

#: The definition, and the tenant the shop's events and tasks belong to.
DEFINITION = "order-events"
TENANT = "shop"
#: Orders placed; paid before any worker ran; paid later; cancelled.
ORDERS = [f"o-{n}" for n in range(1, 11)]
PAID_EARLY = ORDERS[:3]
PAID_LATER = ORDERS[3:8]
CANCELLED = ORDERS[8:]
#: Payments of orders that are not this shop's: they reach no task.
OTHER_PAYMENTS = 20


@dataclasses.dataclass(frozen=True)
class EventRun:
    """What the events did.

    Attributes:
        emitted: events recorded; duplicates: emits of a key emitted before (nothing done).
        started: tasks the triggers started; delivered: deliveries to waiting tasks;
            cancelled: tasks an event cancelled.
        states: the started tasks by how they ended.
    """

    emitted: int
    duplicates: int
    started: int
    delivered: int
    cancelled: int
    states: dict[str, int]

    def lines(self) -> list[str]:
        """What the demo prints about them."""
        ended = ", ".join(f"{n} {state}" for state, n in sorted(self.states.items()))
        return [
            "",
            f"events ({self.emitted} emitted, {self.duplicates} duplicate key; "
            f"{self.started} tasks started by order.placed, {self.delivered} events "
            f"delivered to the waits they match, {self.cancelled} tasks cancelled by one)",
            f"  {DEFINITION:<20} {ended}",
        ]


async def run_events(store: Store, definitions: Iterable[WorkflowDefinition], app: App) -> EventRun:
    """Emit the shop's events around two worker runs; how the orders ended.

    Args:
        store: an open store; the definitions deployed already.
        definitions: the deployed definitions (``order-events`` is picked out).
        app: the example handlers (``order-events`` calls none).
    """
    (definition,) = [d for d in definitions if d.name == DEFINITION][-1:]
    events = store.events
    emitted = duplicates = delivered = cancelled = 0
    started: list[int] = []

    async def emit(name: str, payload: dict[str, object], key: str | None = None) -> None:
        nonlocal emitted, duplicates, delivered, cancelled
        done = await events.emit(name, payload, key=key, tenant=TENANT)
        duplicates += done.duplicate
        emitted += not done.duplicate
        delivered += len(done.delivered)
        cancelled += len(done.cancelled)
        started.extend(done.started)

    for n, order in enumerate(ORDERS, start=1):
        await emit("order.placed", {"order_id": order, "total": 10.0 * n}, key=f"placed-{order}")
    await emit("order.placed", {"order_id": ORDERS[0], "total": 10.0}, key=f"placed-{ORDERS[0]}")
    await emit("order.placed", {"order_id": "o-free", "total": 0})  # `when` is false
    for order in PAID_EARLY:  # before any worker ran: the task finds it when it starts
        await emit("payment.settled", {"order_id": order, "amount": 10.0})
    worker = Worker(store, app, [definition], worker_id=f"demo-events:{socket.gethostname()}")
    config = SupervisorConfig(concurrency=8, until_idle=True)
    await WorkflowSupervisor(worker, config).run()
    for n in range(OTHER_PAYMENTS):
        await emit("payment.settled", {"order_id": f"elsewhere-{n}", "amount": 1.0})
    for order in PAID_LATER:
        await emit("payment.settled", {"order_id": order, "amount": 10.0})
    for order in CANCELLED:
        await emit("order.cancelled", {"order_id": order, "reason": "changed their mind"})
    await WorkflowSupervisor(worker, config).run()
    states: dict[str, int] = {}
    for task_id in started:
        state = (await store.tasks.get(task_id)).state
        states[state] = states.get(state, 0) + 1
    return EventRun(emitted, duplicates, len(started), delivered, cancelled, states)
