"""The LISTEN connection that wakes an idle worker when work arrives (DESIGN §4).

Submits, signals, completions and ended children send ``NOTIFY toolkit_wakeup``; the
listener turns each into a wake-up of the claim loop. Polling with idle backoff is the
fallback, so a listener that cannot listen loses latency, never work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import LiteralString

import anyio
import psycopg
from psycopg.conninfo import make_conninfo

from toolkit.metrics import WorkerMetrics
from toolkit.runtime.config import SupervisorConfig
from toolkit.runtime.statement_gate import StatementGate
from toolkit.store.database import redact_dsn

logger = logging.getLogger("toolkit.runtime.supervisor")

WAKEUP_CHANNEL = "toolkit_wakeup"
_LISTEN: LiteralString = "LISTEN toolkit_wakeup"
#: The LISTEN connection's probe: a statement it must answer after a quiet interval.
_PROBE: LiteralString = "SELECT 1 AS toolkit_listen_probe"
#: TCP keepalives of the LISTEN connection (seconds; ignored on a Unix socket): the kernel
#: finds a peer gone quiet too, between two probes.
_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
               "keepalives_count": "3"}  # fmt: skip


class Listener:
    """One worker's LISTEN connection.

    Args:
        dsn: the store's connection string.
        config: ``listen_probe`` and the reconnect backoff (``idle_backoff_min`` / ``max``).
        metrics: where reconnects are counted.
        wake: called on every notification, and once each time the connection is opened.
        gate: the supervisor's statement gate (LISTEN and each probe run through it).
    """

    def __init__(
        self,
        dsn: str,
        config: SupervisorConfig,
        metrics: WorkerMetrics,
        wake: Callable[[], None],
        gate: StatementGate,
    ) -> None:
        self._dsn = dsn
        self._gate = gate
        self._config = config
        self._metrics = metrics
        self._wake = wake

    async def run(self) -> None:
        """Listen until cancelled; open the connection anew when it drops or goes dead.

        After ``listen_probe`` seconds without a notification the connection must answer a
        probe within as long again: one that stopped delivering without closing (a
        half-open TCP connection behind a NAT, a load balancer, a failed-over proxy) is
        found so, closed and opened again, LISTEN first and then a wake-up, so the claim
        that follows catches up on whatever came meanwhile. Never raises: while it cannot
        listen, polling with idle backoff finds new work.
        """
        config = self._config
        delay = config.idle_backoff_min
        probe = config.listen_probe
        listening = make_conninfo(self._dsn, **_KEEPALIVES)
        opened = False
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    listening, autocommit=True, application_name="runifold", connect_timeout=10
                )
                async with conn:
                    async with self._gate.statement():
                        await conn.execute(_LISTEN)
                    if opened:
                        self._metrics.listen_reconnects.inc()
                    opened = True
                    delay = config.idle_backoff_min
                    self._wake()  # anything submitted while we were not listening
                    while True:
                        async for _ in conn.notifies(timeout=probe):
                            self._wake()
                        async with self._gate.statement():
                            with anyio.fail_after(probe):
                                await conn.execute(_PROBE)
            except TimeoutError:
                logger.warning(
                    "the LISTEN connection to %s did not answer its probe within %g s; "
                    "opening it again",
                    redact_dsn(self._dsn),
                    probe,
                    extra={"action": "listen_dead"},
                )
            except Exception as exc:  # psycopg errors, OSError ...: listen again later
                logger.debug(
                    "LISTEN connection to %s lost: %s",
                    redact_dsn(self._dsn),
                    exc,
                    extra={"action": "listen_lost"},
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, config.idle_backoff_max)
