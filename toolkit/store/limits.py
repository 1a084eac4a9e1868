"""Downstream limits in the store: fleet-wide concurrency slots and token buckets (DESIGN §2).

A named limit bounds the effect calls made inside it over every worker process: at most
``max_concurrency`` at once, and at most ``rate`` per second with bursts of ``burst`` (a token
bucket refilled in database time). An effect step acquires its limits in one transaction
fenced by its lease, before its intent is recorded and its handler called; the fenced write
that appends the occurrence's ``completed`` or ``failed`` evidence releases its slots in the
same statement (``commit_fenced``). A slot counts only while its task holds the lease it was
taken under, so a crashed worker's slot frees itself when its lease expires (docs/limits.md).

Limits are declared by the application (:meth:`toolkit.application.App.limit`, stored by
:meth:`Limits.sync` when a worker starts) or set by an operator (:meth:`Limits.set`,
``toolkit limits set``); an operator's values win over the application's until the row is
removed.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

from psycopg.rows import DictRow

from toolkit.durations import rate_parts
from toolkit.errors import ConfigError, UnknownLimit
from toolkit.store.database import Database
from toolkit.store.fence import Fence
from toolkit.store.limit_acquisition import Acquisitions, LimitDeferral, LimitGrant

__all__ = [
    "KEEP",
    "LimitDeferral",
    "LimitGrant",
    "LimitRecord",
    "LimitSpec",
    "Limits",
    "parse_rate",
]


class _Keep:
    """The type of :data:`KEEP`."""

    def __repr__(self) -> str:
        return "KEEP"


#: Leave a setting as it is (the default of every setting of :meth:`Limits.set`).
KEEP: Final = _Keep()

#: The lowest rate a limit takes, calls per second: one a day (a token's wait stays a day).
MIN_RATE = 1 / 86400


def parse_rate(rate: str | float, what: str = "rate") -> float:
    """A rate as calls per second: ``"600/min"`` → 10.0, ``"20/s"`` → 20.0, ``"5/h"``, or a number.

    Args:
        rate: ``CALLS/UNIT`` with unit ``s``, ``min`` or ``h`` (also ``sec``, ``second``,
            ``m``, ``minute``, ``hour``), or a number of calls per second.
        what: how the value is named in the error message.

    Returns:
        Calls per second, a finite number >= `MIN_RATE`.

    Raises:
        ConfigError: not a rate, or below one a day.
    """
    if isinstance(rate, bool):
        raise ConfigError(f"{what} must be like '600/min', '20/s' or '5/h', not {rate!r}")
    if isinstance(rate, int | float):
        per_second = float(rate)
    else:
        parts = rate_parts(str(rate))
        if parts is None:
            raise ConfigError(f"{what} must be like '600/min', '20/s' or '5/h', not {rate!r}")
        per_second = parts[0] / parts[1]
    if not math.isfinite(per_second) or per_second < MIN_RATE:
        raise ConfigError(f"{what} must be at least 1/day ({MIN_RATE:.3g}/s), not {rate!r}")
    return per_second


@dataclasses.dataclass(frozen=True)
class LimitSpec:
    """A downstream limit as an application declares it (see :meth:`App.limit`).

    Attributes:
        name: the limit's name, used by steps (``limits: [NAME]``) and handlers.
        max_concurrency: most calls inside the limit at once, over every worker; None: no
            bound.
        rate_per_second: calls per second on average; None: no rate.
        burst: the token bucket's size in calls (None without a rate).
        per_tenant: each tenant has its own slots and bucket.
    """

    name: str
    max_concurrency: int | None = None
    rate_per_second: float | None = None
    burst: float | None = None
    per_tenant: bool = False


@dataclasses.dataclass(frozen=True)
class LimitRecord:
    """A limit as stored, with its current use.

    Attributes:
        name: the limit's name.
        max_concurrency: most calls inside it at once (per tenant when ``per_tenant``);
            None: no bound.
        rate_per_second: calls per second it allows on average; None: no rate.
        burst: the bucket's size, in calls (None without a rate).
        per_tenant: each tenant has its own slots and bucket.
        source: ``app`` (as an application declared it) or ``operator`` (set by
            ``toolkit limits set``; a worker's start keeps it).
        in_use: slots held now under live leases, over every scope.
        waiting: tasks waiting for the limit now.
        scopes: by scope (``""`` for a global limit, else the tenant) with anything in use,
            waiting or a bucket not full: ``{"in_use", "waiting", "tokens"}`` (tokens is
            the bucket refilled to now, None without a rate).
        created_at: when the limit was first stored (database time).
        updated_at: when its settings last changed (database time).
    """

    name: str
    max_concurrency: int | None
    rate_per_second: float | None
    burst: float | None
    per_tenant: bool
    source: str
    in_use: int
    waiting: int
    scopes: dict[str, dict[str, Any]]
    created_at: datetime.datetime
    updated_at: datetime.datetime


class Limits:
    """Named downstream limits of one store: declaration, operator changes, acquisition."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._acquisitions = Acquisitions(db)

    async def sync(self, specs: Iterable[LimitSpec]) -> set[str]:
        """Store the limits an application declares (at a worker's start); one statement.

        A new limit is inserted (source ``app``); one already stored is updated only while
        its source is ``app``: an operator's values (``toolkit limits set``) are kept.
        Idempotent.

        Returns:
            The name of every limit the store holds afterwards (declared or not).

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        specs = sorted(specs, key=lambda spec: spec.name)
        rows = await self._db.fetch_all(
            "sync_app_limits",
            {
                "names": [s.name for s in specs],
                "max_concurrency": [s.max_concurrency for s in specs],
                "rates": [s.rate_per_second for s in specs],
                "bursts": [s.burst for s in specs],
                "per_tenant": [s.per_tenant for s in specs],
            },
        )
        return {row["name"] for row in rows}

    async def set(
        self,
        name: str,
        *,
        max_concurrency: int | _Keep | None = KEEP,
        rate: str | float | _Keep | None = KEEP,
        burst: float | _Keep = KEEP,
        per: str | _Keep | None = KEEP,
    ) -> LimitRecord:
        """Create or change a limit at run time (an operator's change); one statement.

        What is not given stays. The limit's source becomes ``operator``: a worker's start
        no longer rewrites it with the application's declaration. Workers apply the change
        at their next acquisition; calls already inside the limit finish (nothing is
        revoked). Tasks waiting for the limit are then made due at once, tenant by tenant.
        Idempotent.

        Args:
            name: the limit's name (non-empty).
            max_concurrency: most calls inside the limit at once (>= 1), None for no bound.
            rate: calls allowed on average: ``"600/min"``, ``"20/s"``, ``"5/h"``, or a number
                per second (> 0); None for no rate.
            burst: the bucket's size in calls (>= 1); default one second's worth (at least
                1) when a rate is first set; kept when only the rate changes. Refused
                without a rate (given, or the limit's own).
            per: ``"tenant"`` (each tenant its own slots and bucket) or None / ``"global"``.

        Returns:
            The limit as stored, with its current use.

        Raises:
            ConfigError: a value is out of range, or a burst has no rate (nothing written).
            DatabaseUnavailable: the database cannot be reached.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError("a limit name must be a non-empty string")
        if not isinstance(max_concurrency, _Keep) and max_concurrency is not None:
            if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
                raise ConfigError(f"max_concurrency of limit {name!r} must be an integer")
            if not 1 <= max_concurrency <= 2**31 - 1:
                raise ConfigError(
                    f"max_concurrency of limit {name!r} must be from 1 to {2**31 - 1},"
                    f" not {max_concurrency}"
                )
        per_second = None
        if not isinstance(rate, _Keep) and rate is not None:
            per_second = parse_rate(rate, f"rate of limit {name!r}")
        if not isinstance(burst, _Keep):
            if isinstance(burst, bool) or not isinstance(burst, int | float):
                raise ConfigError(f"burst of limit {name!r} must be a number")
            if not math.isfinite(burst) or burst < 1:
                raise ConfigError(f"burst of limit {name!r} must be at least 1, not {burst!r}")
        if not isinstance(burst, _Keep) and rate is None:
            raise ConfigError(f"burst of limit {name!r} needs a rate; removing the rate removes it")
        if not isinstance(burst, _Keep) and isinstance(rate, _Keep):
            try:
                current: LimitRecord | None = await self.get(name)
            except UnknownLimit:
                current = None
            if current is None or current.rate_per_second is None:
                raise ConfigError(
                    f"burst of limit {name!r} needs a rate, and the limit has none: give a rate"
                    " with it"
                )
        per_tenant = None
        if not isinstance(per, _Keep):
            if per not in (None, "global", "tenant"):
                raise ConfigError(f"per of limit {name!r} must be 'tenant' or 'global'")
            per_tenant = per == "tenant"
        await self._db.fetch_one(
            "set_limit",
            {
                "name": name,
                "set_max": not isinstance(max_concurrency, _Keep),
                "max_concurrency": None if isinstance(max_concurrency, _Keep) else max_concurrency,
                "set_rate": not isinstance(rate, _Keep),
                "rate": per_second,
                "burst": None if isinstance(burst, _Keep) else float(burst),
                "per_tenant": per_tenant,
            },
        )
        for row in await self._db.fetch_all("limit_waiting_tenants", {"name": name}):
            await self._db.fetch_one(
                "wake_limit_waiters", {"name": name, "tenant": row["tenant"], "ids": None}
            )
        return await self.get(name)

    async def get(self, name: str) -> LimitRecord:
        """Read one limit with its current use.

        Raises:
            UnknownLimit: no limit of that name is stored.
            DatabaseUnavailable: the database cannot be reached.
        """
        rows = await self._db.fetch_all("list_limits", {"name": name})
        if not rows:
            raise UnknownLimit(f"no limit {name!r}")
        return _record(rows[0])

    async def list(self) -> list[LimitRecord]:
        """Every stored limit, by name, with its current use.

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        return [_record(row) for row in await self._db.fetch_all("list_limits", {"name": None})]

    async def acquire(
        self,
        fence: Fence,
        occurrence: str,
        names: Sequence[str],
        deferrals: int = 0,
    ) -> LimitGrant | LimitDeferral:
        """Take a slot and a token of every limit in ``names`` for one step occurrence, or none.

        A transaction fenced by the lease: read the task's lease, lock each limit's scope in
        (name, scope) order, count the live slots and refill the buckets in database time,
        then take a slot of each limit with a ``max_concurrency`` and a token of each with a
        rate. If any limit is full, nothing is taken and the deferral says when to try
        again. The acquisitions a process makes at the same moment share one transaction
        (:mod:`toolkit.store.limit_acquisition`), each decided on its own. Sent
        again after a lost connection, a slot already held under this lease counts as taken
        (a token may be taken twice: a bucket errs on the safe side).

        Args:
            fence: the task's lease (its tenant is the scope of per-tenant limits).
            occurrence: the step occurrence the slots are taken for; its evidence releases them.
            names: the step's limit names; a name the store does not hold limits nothing.
            deferrals: how many times this occurrence was deferred in a row (the slot
                recheck doubles with each).

        Returns:
            :class:`LimitGrant` when everything was taken, else :class:`LimitDeferral`.

        Raises:
            LeaseLost: the lease is no longer held; nothing was taken.
            DatabaseUnavailable: the database cannot be reached (nothing was taken, or all
                was under this lease: call again).
        """
        return await self._acquisitions.acquire(fence, occurrence, names, deferrals)


def _record(row: DictRow) -> LimitRecord:
    return LimitRecord(
        name=row["name"],
        max_concurrency=row["max_concurrency"],
        rate_per_second=row["rate_per_second"],
        burst=row["burst"],
        per_tenant=row["per_tenant"],
        source=row["source"],
        in_use=int(row["in_use"]),
        waiting=int(row["waiting"]),
        scopes=dict(row["scopes"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
