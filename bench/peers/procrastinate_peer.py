"""Procrastinate's no-op processing, for ``bench/peers/compare.py`` (peers' virtualenv).

``seed DSN N``: apply Procrastinate's schema and defer N jobs of task ``noop`` (one batch).
``drain DSN N CONCURRENCY``: one async worker at that concurrency processes them and exits
once no job is left (``wait=False``); it prints the number processed.
"""

from __future__ import annotations

import asyncio
import sys

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=sys.argv[2] if len(sys.argv) > 2 else ""))
done = 0


@app.task(name="noop")
async def noop() -> None:
    global done
    done += 1


async def seed(jobs: int) -> None:
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await noop.batch_defer_async(*[{} for _ in range(jobs)])


async def drain(concurrency: int) -> None:
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False
        )
    print(f"processed {done}")


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "seed":
        asyncio.run(seed(int(sys.argv[3])))
    else:
        asyncio.run(drain(int(sys.argv[4])))
