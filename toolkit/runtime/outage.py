"""Whether the database is reachable, as every part of a supervisor sees it."""

from __future__ import annotations

import logging
import time

from toolkit.metrics import WorkerMetrics
from toolkit.runtime.report import SupervisorReport

logger = logging.getLogger("toolkit.runtime.supervisor")

#: A failure this soon after the database came back is part of the same outage (stale
#: connections of the pool failing one by one), seconds.
OUTAGE_SETTLE = 1.0


class Outage:
    """Whether the database is reachable, as every part of the supervisor sees it.

    The first failure of an outage logs one warning and counts one outage; the first success
    after it logs one line that it is back. Failures in between are silent. Failures within
    :data:`OUTAGE_SETTLE` seconds of a recovery (stale connections failing one by one) are
    announced only if they go on past that long.
    """

    def __init__(self, report: SupervisorReport, metrics: WorkerMetrics) -> None:
        self._report = report
        self._metrics = metrics
        self.down_since: float | None = None
        self._announced = False
        self._last_recovery = -float("inf")
        self.leases_lost = 0

    @property
    def down(self) -> bool:
        """True while the database is presumed unreachable."""
        return self.down_since is not None

    def seen_within(self, seconds: float) -> bool:
        """Whether the database is unreachable now or was within the last ``seconds``."""
        return self.down or time.monotonic() - self._last_recovery < seconds

    def failed(self, exc: BaseException) -> None:
        """A store call found the database unreachable."""
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            self._announced = False
        if self._announced:
            return
        if now - self._last_recovery < OUTAGE_SETTLE and now - self.down_since < OUTAGE_SETTLE:
            return  # maybe a straggler of the outage that just ended
        self._announced = True
        self.leases_lost = 0
        self._report.database_outages += 1
        self._metrics.database_outages.inc()
        logger.warning(
            "database unavailable; the worker keeps its leases while it can and tries again "
            "with backoff: %s",
            exc,
            extra={"action": "database_unavailable"},
        )

    def succeeded(self) -> None:
        """A store call went through."""
        if self.down_since is None:
            return
        now = time.monotonic()
        seconds = now - self.down_since
        self.down_since = None
        self._last_recovery = now
        if self._announced:
            logger.info(
                "database reachable again after %.1f s; leases lost meanwhile: %d",
                seconds,
                self.leases_lost,
                extra={"action": "database_back", "seconds": round(seconds, 3)},
            )
