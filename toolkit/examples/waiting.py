"""Handlers of the examples whose branches wait: file restores and a CI test matrix.

``request_restore`` stands in for a cold-storage service that restores a file later and
completes the step's callback (``toolkit complete TOKEN``); ``run_tests`` for a test
runner. Both are deterministic and offline.
"""

from __future__ import annotations

import logging
from typing import Any

from toolkit.application import EffectContext

logger = logging.getLogger(__name__)


async def request_restore_handler(ctx: EffectContext, file: str) -> dict[str, Any]:
    """Ask for ``file`` to be restored; the storage service completes the callback later."""
    logger.info(
        "restore of %s requested: complete it with `toolkit complete %s --result ...`",
        file, ctx.callback_token, extra={"action": "example_restore_requested"},
    )  # fmt: skip
    return {"file": file, "requested": True}


async def run_tests_handler(ctx: EffectContext, commit: str, suite: str) -> dict[str, Any]:
    """Run test suite ``suite`` of ``commit``: it passes (a stand-in for a test runner)."""
    return {"commit": commit, "suite": suite, "passed": True}
