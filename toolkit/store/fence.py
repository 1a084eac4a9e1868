"""The fence of a lease: what every state-changing write of a task carries (DESIGN §2).

In SQL the guard is written once, as ``toolkit_lease_held(t, worker_id, tenant, token)``
(migration 0007), and every fenced statement takes these four as named parameters.
"""

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


def fence_params(fence: Fence) -> dict[str, str | int]:
    """The fence as the named parameters of a fenced statement (``toolkit_lease_held``).

    Every fenced statement names them the same: ``worker_id``, ``task_id``, ``tenant`` and
    ``token``.
    """
    return {
        "worker_id": fence.worker_id,
        "task_id": fence.task_id,
        "tenant": fence.tenant,
        "token": fence.token,
    }
