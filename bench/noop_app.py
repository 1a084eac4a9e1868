"""The benchmark's handlers: one async effect that does nothing and returns ``{}``.

Run by the worker subprocess as ``toolkit run --app bench.noop_app``; every benchmark
definition calls it, idempotent or not (idempotence is a property of the step).
"""

from __future__ import annotations

from typing import Any

import toolkit

NOOP_HANDLER = "bench.noop"

app = toolkit.App("bench")


@app.effect(NOOP_HANDLER)
async def noop(ctx: toolkit.EffectContext) -> dict[str, Any]:
    return {}


@app.effect("bench.pages")
async def pages(
    ctx: toolkit.EffectContext, total: int, size: int = 1000, cursor: int | None = None
) -> dict[str, Any]:
    """A distributed map's page source: items ``{"n": i}``, ``size`` a page, ``total`` in all."""
    start = cursor or 0
    end = min(start + size, total)
    return {"items": [{"n": n} for n in range(start, end)], "cursor": end if end < total else None}
