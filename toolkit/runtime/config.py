"""How a supervisor runs its worker (:class:`SupervisorConfig`), and how it is told to stop.

Durations are seconds; each is checked to be a finite number in range, naming the setting
(``--lease`` of ``toolkit run`` is ``lease``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from toolkit.errors import ConfigError

#: The shortest heartbeat interval, seconds: shorter ones are a renewal storm, not safety.
MIN_HEARTBEAT = 0.05
#: The longest lease, heartbeat, grace or backoff a supervisor takes, seconds (a day).
MAX_SETTING = 86400.0
#: The least default claim batch, tasks; the default is half the concurrency when more.
MIN_CLAIM_BATCH = 16


class CancellationToken:
    """A one-way flag that asks a supervisor to shut down gracefully.

    ``cancel()`` may be called from any task of the event loop (a signal handler task, a
    test); it is idempotent.
    """

    def __init__(self) -> None:
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Ask for shutdown."""
        if not self._cancelled:
            self._cancelled = True
            for callback in self._callbacks:
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` at cancellation (at once if already cancelled)."""
        self._callbacks.append(callback)
        if self._cancelled:
            callback()


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    """How a supervisor runs its worker. Durations are in seconds.

    Attributes:
        concurrency: cycles running steps at most (this process only; DESIGN §2). A cycle
            whose last write (the one that releases its lease) is on its way no longer
            counts: its slot is claimed again while that write is applied.
        claim_batch: tasks claimed per claim statement at most (a claim across tenants reads
            about what a batch of 16 reads, whatever the batch: docs/tenants.md); None, the
            default, claims half the concurrency, at least :data:`MIN_CLAIM_BATCH`
            (`claim_size`).
        lease: lease duration.
        heartbeat: interval between lease renewals; at most a third of ``lease``.
        idle_backoff_min: first idle wait after an empty claim.
        idle_backoff_max: longest idle wait; it doubles from the minimum up to this.
        idle_jitter: fraction of the wait drawn at random (0 to 1).
        grace: how long a shutdown lets started cycles finish before cancelling them.
        listen_probe: after this long without a notification, the LISTEN connection must
            answer a probe within as long again, or it is opened anew (a connection that
            stopped delivering without closing, behind a NAT or a proxy, is found).
        call_grace: how long a handler call may run past its step's timeout, or a cycle
            past its cancellation, before the supervisor gives it up (stops renewing its
            lease and stops waiting for it): a handler that ignores cancellation.
        checkpoint_window: idempotent effects that end within this long of their cycle's
            last write leave their outcomes to a later write of the cycle, so a crash calls
            at most this much idempotent work again, with the same keys; 0, the default,
            writes each outcome before the next call (DESIGN §4; docs/decisions.md,
            "Idempotent outcomes may share a write").
        until_idle: stop once no task of the loaded definitions is queued, leased, or waiting
            and due (a timer not yet due or a signal wait does not count).

    Raises:
        ConfigError: a value is out of range, or the heartbeat is not well below the lease.
    """

    concurrency: int = 8
    claim_batch: int | None = None
    lease: float = 30.0
    heartbeat: float = 10.0
    idle_backoff_min: float = 0.05
    idle_backoff_max: float = 2.0
    idle_jitter: float = 0.25
    grace: float = 10.0
    until_idle: bool = False
    listen_probe: float = 10.0
    call_grace: float = 5.0
    checkpoint_window: float = 0.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.claim_batch is not None and self.claim_batch < 1:
            raise ConfigError(f"claim_batch must be at least 1, not {self.claim_batch}")
        _seconds("heartbeat", self.heartbeat, MIN_HEARTBEAT)
        _seconds("lease", self.lease, 3 * MIN_HEARTBEAT)
        _seconds("grace", self.grace, 0.0)
        _seconds("listen_probe", self.listen_probe, 0.0, strictly=True)
        _seconds("call_grace", self.call_grace, 0.0)
        _seconds("checkpoint_window", self.checkpoint_window, 0.0)
        _seconds("idle_backoff_min", self.idle_backoff_min, 0.0, strictly=True)
        _seconds("idle_backoff_max", self.idle_backoff_max, 0.0, strictly=True)
        if self.heartbeat > self.lease / 3:
            raise ConfigError(
                f"heartbeat interval {self.heartbeat:g} s must be at most a third of the "
                f"lease ({self.lease:g} s), so one late heartbeat does not lose every lease"
            )
        if not 0 < self.idle_backoff_min <= self.idle_backoff_max:
            raise ConfigError("idle backoff needs 0 < min <= max")
        if not 0 <= self.idle_jitter <= 1:
            raise ConfigError("idle_jitter must be between 0 and 1")

    @property
    def claim_size(self) -> int:
        """Tasks per claim at most.

        ``claim_batch``, or by default half the concurrency, at least :data:`MIN_CLAIM_BATCH`
        (docs/decisions.md, "A claim fills half the slots").
        """
        if self.claim_batch is not None:
            return self.claim_batch
        return max(MIN_CLAIM_BATCH, self.concurrency // 2)


def _seconds(name: str, value: float, least: float, *, strictly: bool = False) -> None:
    """Refuse a duration that is not a finite number of seconds from ``least`` to a day.

    Raises:
        ConfigError: naming the setting (``--lease`` of ``toolkit run`` is ``lease``).
    """
    low = value > least if strictly else value >= least
    if not (isinstance(value, int | float) and math.isfinite(value) and low
            and value <= MAX_SETTING):  # fmt: skip
        bound = f"above {least:g}" if strictly else f"at least {least:g}"
        raise ConfigError(
            f"{name} must be a number of seconds {bound} and at most {MAX_SETTING:g}, "
            f"not {value!r}"
        )
