"""A handler that reports the garbage collector it runs under: ``toolkit run`` sets it for a
worker (``toolkit.runtime.collector``)."""

from __future__ import annotations

import gc
from typing import Any

from toolkit import App, EffectContext

app = App("collector")


@app.effect("probe.collector")
async def collector(ctx: EffectContext) -> dict[str, Any]:
    return {"young_threshold": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}
