"""Stopping the supervisor's service loops between statements, not inside one.

A query cancelled while it runs makes psycopg ask the server to cancel it; under anyio the
cancellation is delivered again while psycopg waits for that answer, so psycopg gives up,
logs "query cancellation interrupted" and closes the connection (a pooled one is then
replaced). So the service loops beside the claim loop (heartbeats, the tick firer, the
watches, the listener's probe) run each statement through a :class:`StatementGate`: at
shutdown the supervisor closes the gate, lets the statements in flight end (for a bounded
time: with the database away one may never end) and only then cancels the loops, each
sleeping between passes or held at the closed gate.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio


class StatementGate:
    """Counts the service statements in flight; once closed, lets no new one start."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._closed = False
        self._drained: anyio.Event | None = None

    @contextlib.asynccontextmanager
    async def statement(self) -> AsyncIterator[None]:
        """Around one service statement (or one short run of them).

        Once the gate is closed, waits until cancelled instead of entering: the supervisor
        is about to cancel the loop.
        """
        if self._closed:
            await anyio.sleep_forever()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self._drained is not None:
                self._drained.set()

    async def close(self, timeout: float) -> None:
        """Let no statement start; wait up to ``timeout`` seconds for those in flight."""
        self._closed = True
        if self._in_flight:
            self._drained = anyio.Event()
            with anyio.move_on_after(timeout):
                await self._drained.wait()
