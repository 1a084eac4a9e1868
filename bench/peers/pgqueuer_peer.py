"""PgQueuer's no-op processing, for ``bench/peers/compare.py`` (run in the peers' virtualenv).

``seed DSN N``: install PgQueuer's schema and enqueue N jobs of entrypoint ``noop`` (one
batch insert). ``drain DSN N``: one worker with PgQueuer's defaults (batch size 10) processes
them with an async no-op and exits once the queue is empty (``mode=drain``); it prints the
number processed.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import asyncpg
from pgqueuer import Job, QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode


def connect(dsn: str) -> Any:
    """asyncpg's connection to ``dsn``, a URL or libpq ``key=value`` pairs."""
    if "://" in dsn:
        return asyncpg.connect(dsn)
    pairs = dict(item.split("=", 1) for item in dsn.split())
    pairs["database"] = pairs.pop("dbname", "postgres")
    return asyncpg.connect(**pairs)


async def seed(dsn: str, jobs: int) -> None:
    connection = await connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    finally:
        await connection.close()


async def drain(dsn: str, jobs: int) -> None:
    connection = await connect(dsn)
    done = 0
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

        await manager.run(mode=QueueExecutionMode.drain)
    finally:
        await connection.close()
    print(f"processed {done}")


if __name__ == "__main__":
    command, dsn, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run({"seed": seed, "drain": drain}[command](dsn, count))
