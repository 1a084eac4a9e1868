"""The group commit: the fenced writes of concurrent cycles, one statement (DESIGN §4)."""

from __future__ import annotations

import asyncio
import math

import anyio

from toolkit.errors import DatabaseUnavailable, LeaseLost, StoreError, ToolkitError
from toolkit.lifecycle import TaskState
from toolkit.store.leases import Leases
from toolkit.store.writes import FencedWrite


class GroupCommit:
    """Gathers the fenced writes of concurrent cycles into one statement (DESIGN §4).

    A cycle calls :meth:`commit` and waits; the writer (:meth:`run`, a task of the
    supervisor) takes every write queued by then, lets the event loop run once more so that
    cycles finishing at the same moment join, and applies them with one
    :meth:`Leases.commit_many`. Each write stays fenced on its own. If the database refuses
    the batch (a value it cannot store), each write is retried alone so only the faulty one
    fails.

    Args:
        leases: the store's leases.
        max_batch: most writes per statement.
    """

    def __init__(self, leases: Leases, max_batch: int = 256) -> None:
        self._leases = leases
        self._max_batch = max_batch
        self._queue: list[_PendingWrite] = []
        # asyncio's events, not anyio's: a batch and each write make one, and anyio's costs
        # ten times as much to make (it looks up the running library); the worker runs on
        # asyncio only (docs/decisions.md)
        self._ready = asyncio.Event()
        self._running = False
        self._shield: anyio.CancelScope | None = None
        self._stop_deadline = math.inf

    async def commit(self, write: FencedWrite) -> TaskState:
        """Apply ``write`` with the next batch; same contract as :meth:`Leases.commit`.

        Falls back to a statement of its own when no writer runs.
        """
        if not self._running:
            return await self._leases.commit(write)
        pending = _PendingWrite(write)
        self._queue.append(pending)
        self._ready.set()
        # A cycle cancelled while it waits here leaves its write queued: the write carries
        # evidence the cycle has already handed over, and it applies (fenced) before any
        # later write of the same task (one write per task per batch).
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        if pending.state is None:
            raise LeaseLost(task_id=write.fence.task_id, token=write.fence.token)
        return pending.state

    def stop_soon(self, grace: float) -> None:
        """Give the batch in flight at most ``grace`` more seconds once the writer is cancelled.

        A batch in flight is shielded from cancellation so that it is not cut off half-way;
        during an outage it could wait for a connection for the pool's whole timeout. Call
        this before cancelling :meth:`run`: past ``grace`` the batch is abandoned (the fence
        and the write ids keep that safe) and its writers get ``DatabaseUnavailable``.
        """
        self._stop_deadline = anyio.current_time() + grace
        if self._shield is not None:
            self._shield.deadline = self._stop_deadline

    async def run(self) -> None:
        """The writer loop; runs until cancelled, then fails every write still queued."""
        self._running = True
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                await anyio.sleep(0)  # one more turn of the loop: let simultaneous writes join
                while self._queue:
                    batch = self._take_batch()
                    with anyio.CancelScope(shield=True, deadline=self._stop_deadline) as shield:
                        self._shield = shield
                        await self._apply(batch)
                    self._shield = None
                    for pending in batch:  # abandoned at the stop deadline
                        if not pending.done.is_set():
                            pending.finish(error=_writer_stopped())
        finally:
            self._running = False
            for pending in self._queue:
                pending.finish(error=_writer_stopped())
            self._queue.clear()

    def _take_batch(self) -> list[_PendingWrite]:
        """Take up to ``max_batch`` queued writes, at most one per task, in queue order.

        A second write of the same task (one queued by a cycle cancelled while its previous
        write waited) stays queued for the next batch, so the two apply in order.
        """
        batch: list[_PendingWrite] = []
        later: list[_PendingWrite] = []
        tasks: set[int] = set()
        for pending in self._queue:
            if len(batch) < self._max_batch and pending.write.fence.task_id not in tasks:
                tasks.add(pending.write.fence.task_id)
                batch.append(pending)
            else:
                later.append(pending)
        self._queue[:] = later
        return batch

    async def _apply(self, batch: list[_PendingWrite]) -> None:
        try:
            applied = await self._leases.commit_many([p.write for p in batch])
        except StoreError as exc:
            if len(batch) == 1:
                batch[0].finish(error=exc)
                return
            for pending in batch:  # apply one by one: only the refused write fails
                await self._apply([pending])
            return
        except ToolkitError as exc:
            for pending in batch:
                pending.finish(error=exc)
            return
        except Exception as exc:  # e.g. a value the driver cannot adapt: the writer lives on
            if len(batch) > 1:
                for pending in batch:
                    await self._apply([pending])
                return
            batch[0].finish(error=StoreError(f"the write could not be sent: {exc!r}"))
            return
        for pending in batch:
            pending.finish(state=applied.get(pending.write.fence.task_id))


def _writer_stopped() -> DatabaseUnavailable:
    return DatabaseUnavailable("the worker's writer stopped before this write was applied")


class _PendingWrite:
    """A write waiting for its batch: the result is a state, None (lease lost) or an error."""

    def __init__(self, write: FencedWrite) -> None:
        self.write = write
        self.done = asyncio.Event()
        self.state: TaskState | None = None
        self.error: ToolkitError | None = None

    def finish(self, *, state: TaskState | None = None, error: ToolkitError | None = None) -> None:
        self.state = state
        self.error = error
        self.done.set()
