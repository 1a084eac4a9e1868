"""The fence of a lease: what every state-changing write of a task carries (DESIGN §2)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Fence:
    """What every state-changing write of a task carries (DESIGN §2).

    The lease holder's worker id, the task and its tenant, and the fencing token of the
    lease. A write is applied only while this lease is held and unexpired, in the same
    statement.

    The tenant travels with every per-task write, so a store distributed by tenant routes
    each one to its shard (DESIGN §6).
    """

    worker_id: str
    task_id: int
    tenant: str
    token: int
