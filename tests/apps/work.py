"""Stand-ins for a handler's own work (a call to a slow service, a long computation).

Handlers in the test apps take time on purpose; these say so. A test waiting for
something still waits on an event or a store condition (``tests.helpers``), not on these.
"""

from __future__ import annotations

import time

import anyio


async def slow_call(seconds: float) -> None:
    """Take ``seconds`` without holding the event loop, as an awaited remote call does."""
    await anyio.sleep(seconds)


def blocking_work(seconds: float) -> None:
    """Hold the calling thread for ``seconds``, as CPU-bound or blocking-library work does."""
    time.sleep(seconds)
