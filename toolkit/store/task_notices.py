"""Hearing about one task through LISTEN/NOTIFY, with polling as the fallback.

Readers that follow a task (``Tasks.result`` with a wait, ``Streams.follow``) open one
listening connection and, between reads, wait for news of the task or the poll interval,
whichever comes first. Without notifications they still read every poll interval.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, LiteralString

import anyio
import psycopg

from toolkit.store.database import Database, translated_errors

#: The channel of progress values (payload: ``{"task": id, "value": ...}``).
PROGRESS_CHANNEL = "toolkit_progress"


async def listen(
    db: Database, channels: Sequence[LiteralString], application_name: str
) -> psycopg.AsyncConnection[Any] | None:
    """A connection listening on ``channels`` (``LISTEN name`` statements).

    Returns None when it cannot be had: the caller then polls.
    """
    try:
        with translated_errors(db.dsn):
            conn = await psycopg.AsyncConnection.connect(
                db.dsn, autocommit=True, application_name=application_name
            )
            for channel in channels:
                await conn.execute(channel)
            return conn
    except Exception:  # no notifications: the polls still find everything
        return None


async def task_news(
    listening: psycopg.AsyncConnection[Any] | None, task_id: int, seconds: float
) -> AsyncIterator[Any]:
    """Wait for news of ``task_id`` or ``seconds``, whichever comes first.

    News is a notice whose payload is the task's id; the progress values announced for the
    task meanwhile are yielded.
    """
    if listening is None:
        await anyio.sleep(seconds)
        return
    wanted = str(task_id)
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            async for notice in listening.notifies(timeout=left):
                if notice.channel == PROGRESS_CHANNEL:
                    news = json.loads(notice.payload)
                    if news.get("task") == task_id:
                        yield news.get("value")
                elif notice.payload == wanted:
                    return
    except psycopg.Error:  # the connection dropped: wait out the poll interval
        await anyio.sleep(max(0.0, end - time.monotonic()))
