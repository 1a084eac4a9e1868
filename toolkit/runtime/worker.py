"""A worker: one process's identity, its handlers and the definitions it can run.

A worker claims only tasks pinned to a definition digest it has loaded (DESIGN §2, §4), so a
checkpoint is never resumed with another graph.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from collections.abc import Mapping, Sequence

from toolkit.application import App
from toolkit.definition import WorkflowDefinition
from toolkit.errors import ConfigError
from toolkit.store import Store
from toolkit.store.fence import Fence
from toolkit.store.leases import ClaimedTask, Renewal


def default_worker_id() -> str:
    """A worker id stable per host and working directory: ``HOST:CWDHASH``.

    A restart in the same place keeps its id (metrics and history line up); a second live
    worker started in the same place is refused and needs its own ``--worker-id``.
    """
    place = hashlib.sha256(os.getcwd().encode()).hexdigest()[:8]
    return f"{socket.gethostname()}:{place}"


class Worker:
    """The store, the app's handlers and the loaded definitions of one worker process.

    Args:
        store: an open store.
        app: the handler registry; every effect of every definition must have a handler.
        definitions: the definitions this worker runs (at least one).
        worker_id: the id fencing every write; default :func:`default_worker_id`.

    Raises:
        ConfigError: no definitions were given.
        MissingHandlers: an effect names a handler the app does not have.
    """

    def __init__(
        self,
        store: Store,
        app: App,
        definitions: Sequence[WorkflowDefinition],
        *,
        worker_id: str | None = None,
    ) -> None:
        if not definitions:
            raise ConfigError("a worker needs at least one workflow definition to run")
        app.check(definitions)
        self.store = store
        self.app = app
        self.worker_id = worker_id or default_worker_id()
        #: This process's registration of the id: drawn anew for each worker object.
        self.incarnation = secrets.token_hex(8)
        self._by_digest: Mapping[str, WorkflowDefinition] = {d.digest: d for d in definitions}
        self._digests = list(self._by_digest)

    @property
    def definitions(self) -> list[WorkflowDefinition]:
        """The loaded definitions."""
        return list(self._by_digest.values())

    def definition(self, digest: str) -> WorkflowDefinition:
        """The loaded definition with this digest (claims return only these)."""
        return self._by_digest[digest]

    async def register(
        self, concurrency: int, lease_seconds: float, heartbeat_seconds: float | None = None
    ) -> None:
        """Store the app's limits, deploy the definitions and register the worker id.

        The app's declared limits are stored first (a limit an operator set keeps the
        operator's values, see :meth:`toolkit.store.limits.Limits.sync`); then every limit a step
        or handler names must be declared or stored.

        Raises:
            MissingLimits: a step or handler names a limit declared nowhere.
            DefinitionConflict: a definition's version is registered with another digest.
            WorkerIdInUse: another live process holds the id.
        """
        stored = await self.store.limits.sync(self.app.limit_specs)
        self.app.check_limits(self._by_digest.values(), stored)
        for definition in self._by_digest.values():
            await self.store.definitions.deploy(definition)
        await self.store.workers.register(
            self.worker_id,
            incarnation=self.incarnation,
            concurrency=concurrency,
            definitions=[
                {"name": d.name, "version": d.version, "digest": d.digest}
                for d in self._by_digest.values()
            ],
            lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat_seconds or lease_seconds / 3,
        )

    async def unregister(self) -> None:
        """Record the worker stopped; an unreachable database is ignored (its row expires)."""
        try:
            await self.store.workers.stop(self.worker_id, self.incarnation)
        except Exception:
            pass

    async def claim(
        self, limit: int, lease_seconds: float, *, deferring: bool = False
    ) -> list[ClaimedTask]:
        """Claim up to ``limit`` due tasks of the loaded definitions (see ``Leases.claim``)."""
        return await self.store.leases.claim(
            self.worker_id, self._digests, limit, lease_seconds, deferring=deferring
        )

    async def renew(self, fences: Sequence[Fence], lease_seconds: float) -> Renewal:
        """Renew the held leases and the worker's registration (see ``Leases.renew``)."""
        return await self.store.leases.renew(
            self.worker_id, self.incarnation, fences, lease_seconds
        )

    async def idle_state(self) -> tuple[bool, float | None]:
        """``(pending, next_due)`` for the loaded definitions (see ``Tasks.idle_state``)."""
        return await self.store.tasks.idle_state(self._digests)
