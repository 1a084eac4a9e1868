"""What handlers stream while a step runs: durable items and progress (docs/progress.md).

- ``publish`` writes one item of the task's stream at once, in its own small fenced write
  (not held until the step commits): numbered per task, refused for a stale lease.
- ``progress`` sends a value through NOTIFY only: best effort, never stored or replayed.
- ``follow`` reads a task's stream as it grows, its progress and its state changes, until
  it ends: woken by LISTEN/NOTIFY, polling as the fallback.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import AsyncIterator
from typing import Any, Literal, LiteralString

from psycopg.types.json import Jsonb

from toolkit.errors import InputError, LeaseLost, PayloadRefused, UnknownTask
from toolkit.payload import PayloadLimits, check_payload
from toolkit.store.database import Database
from toolkit.store.fence import Fence, fence_params
from toolkit.store.task_notices import listen, task_news
from toolkit.store.task_reads import TERMINAL_STATES
from toolkit.store.task_tenants import task_tenant

#: Largest published item, bytes of JSON text.
MAX_ITEM_BYTES = 64 * 1024
#: Largest progress value, bytes of JSON text (a NOTIFY payload holds at most 8,000).
MAX_PROGRESS_BYTES = 7000
#: Most items of one task's stream.
MAX_ITEMS = 10_000

_CHANNELS: tuple[LiteralString, ...] = (
    "LISTEN toolkit_stream", "LISTEN toolkit_progress", "LISTEN toolkit_task_ended",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """One thing a reader of a task learns (see :meth:`Streams.follow`).

    Attributes:
        kind: ``item`` (a published value, durable), ``progress`` (a progress value, best
            effort) or ``state`` (the task's state changed; the last one is its end).
        value: the item's or progress value; for ``state``, the state (``"leased"``, ...).
        seq: the item's number in the task's stream (from 1); None for the other kinds.
        occurrence: the step occurrence that published the item; None for the other kinds.
        at: when it was published (items), database time; None for the other kinds.
        detail: for ``state``: the wait reason, and for an end the result or the error.
    """

    kind: Literal["item", "progress", "state"]
    value: Any
    seq: int | None = None
    occurrence: str | None = None
    at: datetime.datetime | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


def _checked(value: Any, limit: int, what: str, limits: PayloadLimits) -> str:
    """The JSON text of ``value``, refused past the payload limits or ``limit`` bytes.

    Raises:
        InputError: not storable JSON, too deep, or larger than ``limit``.
    """
    try:
        check_payload(value, limits)
    except PayloadRefused as exc:
        raise InputError(f"{what}: {exc}", path=exc.path) from exc
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode())
    if size > limit:
        raise InputError(f"{what} is {size} bytes of JSON, more than {limit}", path="$")
    return text


class Streams:
    """Handler streams of one store: publish, progress, read and follow."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def publish(self, fence: Fence, occurrence: str, value: Any) -> int:
        """Append ``value`` to the task's stream, under its lease.

        Args:
            fence: the lease of the publishing call.
            occurrence: the step occurrence publishing.
            value: JSON, at most `MAX_ITEM_BYTES` of it.

        Returns:
            The item's number in the task's stream (1, 2, ...).

        Raises:
            InputError: the value is not storable JSON or too large, or the task's stream
                has `MAX_ITEMS` items.
            LeaseLost: the lease is no longer held (a stale worker): nothing was written.
        """
        _checked(value, MAX_ITEM_BYTES, "a published item", self._db.payload_limits)
        params = {**fence_params(fence), "occurrence": occurrence, "value": Jsonb(value),
                  "max_items": MAX_ITEMS}  # fmt: skip
        row = await self._db.fetch_one("publish_item", params)
        if row is not None:
            return int(row["seq"])
        full = await self._db.fetch_one("stream_full", params)
        if full is not None and full["full"]:
            raise InputError(f"task {fence.task_id} has published {MAX_ITEMS} items, the most")
        raise LeaseLost(task_id=fence.task_id, token=fence.token)

    async def progress(self, task_id: int, value: Any) -> None:
        """Send a progress value of a task to its readers (NOTIFY; not stored).

        Raises:
            InputError: the value is not JSON or larger than `MAX_PROGRESS_BYTES`.
        """
        text = _checked(value, MAX_PROGRESS_BYTES, "a progress value", self._db.payload_limits)
        payload = f'{{"task":{task_id},"value":{text}}}'
        await self._db.fetch_one("report_progress", {"payload": payload})

    async def items(
        self, task_id: int, after: int = 0, limit: int = 1000, *, tenant: str | None = None
    ) -> list[StreamEvent]:
        """The task's stream items after number ``after``, in order (at most ``limit``).

        ``tenant``: the task's, if known; else looked up by the id
        (:func:`~toolkit.store.task_tenants.task_tenant`).
        """
        tenant = await task_tenant(self._db, task_id, tenant)
        params = {"task_id": task_id, "tenant": tenant, "after": after, "limit": limit}
        rows = await self._db.fetch_all("stream_items", params)
        return [
            StreamEvent("item", row["value"], row["seq"], row["occurrence"], row["published_at"])
            for row in rows
        ]

    async def follow(
        self,
        task_id: int,
        *,
        after: int = 0,
        poll: float = 1.0,
        progress: bool = True,
        tenant: str | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Yield a task's stream items, its progress and its state changes until it ends.

        The stream's items after number ``after`` come in order, each once, and the last
        event is the task's end state, after its last items; progress values come as they
        are sent while following (best effort: none is replayed). Woken by LISTEN/NOTIFY;
        without notifications it reads every ``poll`` seconds. ``tenant``: as :meth:`items`.

        Raises:
            UnknownTask: no such task.
        """
        listening = await listen(self._db, _CHANNELS, "runifold-watch")
        try:
            tenant = await task_tenant(self._db, task_id, tenant)
            params = {"task_id": task_id, "tenant": tenant}
            row = await self._db.fetch_one("await_task", params)
            if row is None:
                raise UnknownTask(f"no task {task_id}")
            shown: tuple[str, str | None] | None = None
            while True:
                state = (row["state"], row["wait_reason"])
                if state != shown and row["state"] not in TERMINAL_STATES:
                    shown = state
                    yield StreamEvent("state", row["state"], detail=_wait(row))
                for item in await self.items(task_id, after, tenant=tenant):
                    after = item.seq or after
                    yield item
                if row["state"] in TERMINAL_STATES:
                    yield StreamEvent("state", row["state"], detail=_ending(row))
                    return
                async for value in task_news(listening, task_id, poll):
                    if progress:
                        yield StreamEvent("progress", value)
                row = await self._db.fetch_one("get_task", params)
                assert row is not None
        finally:
            if listening is not None:
                await listening.close()


def _wait(row: dict[str, Any]) -> dict[str, Any]:
    return {"wait_reason": row["wait_reason"]} if row["wait_reason"] else {}


def _ending(row: dict[str, Any]) -> dict[str, Any]:
    if row["state"] == "succeeded":
        return {"result": row["result"]}
    return {"error": row["error"]}
