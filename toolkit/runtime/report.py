"""What a supervisor did: :class:`SupervisorReport`, returned by its run."""

from __future__ import annotations

import dataclasses

from toolkit.engine import CycleOutcome


@dataclasses.dataclass
class SupervisorReport:
    """What a supervisor did, returned by :meth:`WorkflowSupervisor.run`.

    Attributes:
        worker_id: the worker's id.
        claimed: tasks claimed (takeovers included).
        recovered: claims of tasks whose previous lease had expired.
        cycles: claim-and-execute cycles finished.
        succeeded: cycles that ended the task ``succeeded``.
        failed: cycles that ended the task ``failed``.
        cancelled: cycles that ended the task ``cancelled``.
        waiting: cycles that left the task ``waiting``.
        retried: cycles that scheduled a retry.
        released: cycles released at shutdown.
        lease_lost: cycles that lost their lease.
        database_outages: times the database became unreachable.
        registration_lost: the run stopped because another process took its worker id over
            while it was away (see ``Worker.incarnation``).
        abandoned: cycles given up because their handler call ignored its cancellation
            (their leases lapsed; the process should exit without waiting for them).
        max_loop_lag: the longest event-loop stall seen, seconds.
        queue_delay_total: sum of queue delays of claimed tasks, seconds.
        wall_time: seconds from start to return.
    """

    worker_id: str
    claimed: int = 0
    recovered: int = 0
    cycles: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    waiting: int = 0
    retried: int = 0
    released: int = 0
    lease_lost: int = 0
    database_outages: int = 0
    registration_lost: bool = False
    abandoned: int = 0
    max_loop_lag: float = 0.0
    queue_delay_total: float = 0.0
    wall_time: float = 0.0

    def count(self, outcome: CycleOutcome) -> None:
        """Count one finished cycle."""
        self.cycles += 1
        field = {
            CycleOutcome.SUCCEEDED: "succeeded",
            CycleOutcome.FAILED: "failed",
            CycleOutcome.CANCELLED: "cancelled",
            CycleOutcome.WAITING: "waiting",
            CycleOutcome.RETRY: "retried",
            CycleOutcome.RELEASED: "released",
            CycleOutcome.LEASE_LOST: "lease_lost",
        }.get(outcome)
        if field is not None:
            setattr(self, field, getattr(self, field) + 1)
