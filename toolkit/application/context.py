"""What a handler learns about the call it serves: :class:`EffectContext`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio.from_thread
import anyio.lowlevel
import psycopg

from toolkit.application.spend import SpendMeter
from toolkit.errors import EffectCancelled, InputError
from toolkit.store.tags import MAX_TAGS, check_tag


class StopFlag:
    """Set once a handler call should stop (``EffectContext.cancelled``).

    Set from the event loop, read from the handler's thread: a plain attribute, whose write
    and read are each atomic, so a call needs no lock, condition or event of its own (one is
    made per call: issue 22). Nothing waits on it; a handler polls it between units of work.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        """Tell the call to stop."""
        self._set = True

    def is_set(self) -> bool:
        """Whether the call was told to stop."""
        return self._set


@dataclasses.dataclass(frozen=True)
class EffectContext:
    """What a handler learns about the call it serves.

    Attributes:
        task_id: the task's id.
        tenant: the task's tenant.
        workflow: ``(name, version)`` of the definition.
        step: the step id.
        occurrence: the step occurrence, e.g. ``"charge#2"`` on the second entry of a loop.
        attempt: 1 for the first attempt at this occurrence, then 2, 3, ...
        fencing_token: the lease's fencing token; a write to another system can carry it so
            that system can refuse a stale writer.
        idempotency_key: stable across retries, crashes and takeovers of this occurrence,
            different for every other occurrence; pass it to the system you call.
        callback_token: for a step with ``callback``: the token to hand to the external
            system, which completes the step with ``toolkit complete TOKEN`` (one per
            occurrence and attempt); None for other steps.
        task_tags: the task's tags when the call began (see :attr:`tags` for those with
            this call's own).
    """

    task_id: int
    tenant: str
    workflow: tuple[str, int]
    step: str
    occurrence: str
    attempt: int
    fencing_token: int
    idempotency_key: str
    _connection: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]] = (
        dataclasses.field(repr=False)
    )
    _stop: StopFlag = dataclasses.field(default_factory=StopFlag, repr=False)
    _spend: SpendMeter | None = dataclasses.field(default=None, repr=False)
    callback_token: str | None = None
    task_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    _tags_set: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    _publish: Callable[[Any], Awaitable[int]] | None = dataclasses.field(default=None, repr=False)
    _progress: Callable[[Any], Awaitable[None]] | None = dataclasses.field(
        default=None, repr=False
    )
    _loop: anyio.lowlevel.EventLoopToken | None = dataclasses.field(default=None, repr=False)
    _rates: dict[str, list[float]] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def tags(self) -> dict[str, str]:
        """The task's tags with those this call set (:meth:`tag`)."""
        return {**self.task_tags, **self._tags_set}

    def tag(self, key: str, value: str) -> None:
        """Set tag ``key`` of the task to ``value``, e.g. ``ctx.tag("carrier", "dhl")``.

        The tag is written with the step's outcome (completed or failed evidence), in the
        same fenced commit, and an operator can then find the task by it (``toolkit tasks
        --tag carrier=dhl``). A call that is cancelled or whose lease is lost writes none.

        Raises:
            InputError: ``key`` or ``value`` is not a tag (docs/many-tasks.md, "Tags"), or
                the task would have more than 32 tags.
        """
        check_tag(key, value, path="ctx.tag")
        if key not in self.task_tags and key not in self._tags_set:
            if len(self.task_tags) + len(self._tags_set) >= MAX_TAGS:
                raise InputError(
                    f"tag {key!r}: the task has {MAX_TAGS} tags already, the most it may have",
                    path="ctx.tag",
                )
        self._tags_set[key] = value

    def spend(self, **amounts: float) -> None:
        """Report what this call used of budgeted resources, e.g. ``ctx.spend(tokens=812)``.

        The amounts are recorded with the effect's evidence (fenced: a stale worker's spend
        never counts) and charged to the task's budget (or the reservation of the parallel
        or map step the call runs in) and the tenant's. Call it once the resource is used:
        it is recorded even when it raises.

        Args:
            amounts: resource name to amount used (≥ 0), in the resource's own unit.

        Raises:
            BudgetExceeded: the amount takes the call over what remained for it; the step
                fails with this error (it is not retried).
            ValueError: an amount is negative or not a number.
        """
        if self._spend is not None:  # None: a context built outside the engine
            self._spend.add(amounts)

    async def publish(self, value: Any) -> int:
        """Append ``value`` to the task's stream now, durably (docs/progress.md).

        Written at once in a small fenced write of its own, not held until the step
        commits: readers (``toolkit watch``, ``store.streams.follow``) see it while the step
        runs. Items are numbered per task; a call whose lease was lost publishes nothing.

        Args:
            value: JSON, at most 64 KiB of it.

        Returns:
            The item's number in the task's stream (1, 2, ...).

        Raises:
            InputError: not JSON, larger than 64 KiB, more than 50 items a second from this
                call, or the task's 10,000th item passed.
            LeaseLost: the lease is no longer this worker's: stop.
        """
        if self._publish is None:
            raise RuntimeError("publish needs a context the engine made (a running step)")
        self._pace("publish", 50)
        return await self._publish(value)

    async def progress(self, value: Any) -> None:
        """Tell the task's readers how the call goes: ``ctx.progress({"done": 40})``.

        Best effort and never stored: sent through NOTIFY to the readers following now,
        not replayed to later ones, lost with the connection. More than 20 a second from
        one call are dropped (the next ones get through).

        Raises:
            InputError: not JSON, or more than 7,000 bytes of it.
        """
        if self._progress is None:
            raise RuntimeError("progress needs a context the engine made (a running step)")
        try:
            self._pace("progress", 20)
        except InputError:
            return  # best effort: dropped
        await self._progress(value)

    def publish_sync(self, value: Any) -> int:
        """`publish` from a sync handler (it runs in a thread of its own)."""
        return anyio.from_thread.run(self.publish, value, token=self._loop)

    def progress_sync(self, value: Any) -> None:
        """`progress` from a sync handler."""
        anyio.from_thread.run(self.progress, value, token=self._loop)

    def _pace(self, what: str, per_second: int) -> None:
        """Refuse a ``what`` past ``per_second`` in the last second of this call."""
        now = time.monotonic()
        recent = [t for t in self._rates.get(what, []) if now - t < 1.0]
        if len(recent) >= per_second:
            raise InputError(
                f"ctx.{what}: more than {per_second} a second from one call; send fewer,"
                " larger values",
                path=f"ctx.{what}",
            )
        recent.append(now)
        self._rates[what] = recent

    @property
    def cancelled(self) -> bool:
        """True once the call should stop.

        That is: the task was cancelled, its lease was lost, the step's timeout passed, or
        the worker is shutting down past its grace period. Async handlers are cancelled by
        anyio; sync handlers (run in a thread) cannot be, so they should check this, or call
        :meth:`check_cancelled`, between units of work.
        """
        return self._stop.is_set()

    def check_cancelled(self) -> None:
        """Raise :class:`~toolkit.errors.EffectCancelled` if :attr:`cancelled` is true."""
        if self._stop.is_set():
            raise EffectCancelled(f"step {self.step!r} of task {self.task_id} was cancelled")

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """Borrow an autocommit connection to the store's database for application tables.

        Use it as ``async with ctx.connection() as conn: ...``. Writes made here are the
        application's, not fenced by the lease: key them by :attr:`idempotency_key`.
        """
        return self._connection()
