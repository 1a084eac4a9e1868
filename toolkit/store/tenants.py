"""Tenant admission settings: weights, active limits, pause, budget amounts (DESIGN §2).

A tenant is registered by its first submit (with the defaults: weight 1, no limit, not
paused) or by :meth:`Tenants.set`. The claim reads these settings on every claim, so a
change applies to the next claim of every worker; tasks already leased keep their leases
(docs/tenants.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from psycopg.rows import DictRow

from toolkit.errors import ConfigError, InputError, UnknownTenant
from toolkit.store.database import Database
from toolkit.store.names import check_tenant


class _Keep:
    """The type of :data:`KEEP`."""

    def __repr__(self) -> str:
        return "KEEP"


#: Leave a setting as it is (the default of every setting of :meth:`Tenants.set`).
KEEP: Final = _Keep()

Amount = Decimal | int | float | str


@dataclasses.dataclass(frozen=True)
class Budget:
    """A tenant's budget of one named resource.

    Attributes:
        amount: what the tenant may use in all, in the resource's own unit.
        used: what was spent plus what is reserved (kept by the budget reservations).
        reserved: the part of ``used`` that live tasks hold as reservations.
    """

    amount: Decimal
    used: Decimal
    reserved: Decimal = Decimal(0)

    @property
    def remaining(self) -> Decimal:
        """``amount - used``; negative when a spend outside a reservation overran it."""
        return self.amount - self.used


@dataclasses.dataclass(frozen=True)
class TenantRecord:
    """A tenant's admission settings with its live task counts.

    Attributes:
        tenant: the tenant's name.
        max_active: most leased tasks with an unexpired lease at once; None: no limit.
        weight: the tenant's share of the leased slots against other tenants with due
            tasks (a positive integer; 2 gets twice the share of 1).
        paused: no task of the tenant is claimed.
        queued: tasks queued (due or not).
        leased: tasks leased, expired leases included.
        active: leased tasks whose lease has not expired: what ``max_active`` bounds.
        waiting: tasks waiting (timer, signal, reconciliation ...).
        budgets: budget by resource name.
        created_at: when the tenant was registered (database time).
        updated_at: when its settings last changed (database time).
    """

    tenant: str
    max_active: int | None
    weight: int
    paused: bool
    queued: int
    leased: int
    active: int
    waiting: int
    budgets: dict[str, Budget]
    created_at: datetime.datetime
    updated_at: datetime.datetime


class Tenants:
    """Tenant admission settings and budget amounts.

    Stored in ``toolkit_tenants`` and ``toolkit_tenant_budgets``; read by every claim
    (:meth:`toolkit.store.leases.Leases.claim`).
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def set(
        self,
        tenant: str,
        *,
        max_active: int | _Keep | None = KEEP,
        weight: int | _Keep = KEEP,
        paused: bool | _Keep = KEEP,
        budgets: Mapping[str, Amount | None] | None = None,
    ) -> TenantRecord:
        """Create or change a tenant's settings, in one statement; what is not given stays.

        A tenant that does not exist yet is created with the defaults (weight 1, no limit,
        not paused) before the given settings apply, so limits can be set before its first
        submit. Idempotent. Idle workers are woken (a resumed tenant may have due tasks).

        Args:
            tenant: the tenant's name (non-empty).
            max_active: most leased tasks with an unexpired lease at once (>= 1), or None
                for no limit. Lowering it below the current count revokes no lease: the
                tenant gets no new task until it is back under the limit.
            weight: the tenant's share of the leased slots (>= 1).
            paused: True stops claims of its tasks (leased ones run on); False resumes.
            budgets: resource name to amount (>= 0, in the resource's unit; ``used`` is
                kept), or to None to remove that budget.

        Returns:
            The tenant as stored after the change, with live counts.

        Raises:
            ConfigError: a value is out of range (nothing written).
            DatabaseUnavailable: the database cannot be reached.
        """
        try:
            check_tenant(tenant)
        except InputError as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(max_active, _Keep) and max_active is not None:
            _positive(max_active, f"max_active of tenant {tenant!r}")
        if not isinstance(weight, _Keep):
            _positive(weight, f"weight of tenant {tenant!r}")
        amounts = {
            resource: None if amount is None else _amount(amount, tenant, resource)
            for resource, amount in (budgets or {}).items()
        }
        for resource in amounts:
            if not isinstance(resource, str) or not resource:
                raise ConfigError(f"a budget resource of tenant {tenant!r} has no name")
        await self._db.fetch_one(
            "set_tenant",
            {
                "tenant": tenant,
                "set_max_active": not isinstance(max_active, _Keep),
                "max_active": None if isinstance(max_active, _Keep) else max_active,
                "weight": None if isinstance(weight, _Keep) else weight,
                "paused": None if isinstance(paused, _Keep) else bool(paused),
                "resources": list(amounts),
                "amounts": list(amounts.values()),
            },
        )
        return await self.get(tenant)

    async def set_budget(self, tenant: str, resource: str, amount: Amount) -> TenantRecord:
        """Set the amount of one budget (created if new; ``used`` is kept).

        Same as ``set(tenant, budgets={resource: amount})``; see :meth:`set`.
        """
        return await self.set(tenant, budgets={resource: amount})

    async def clear_budget(self, tenant: str, resource: str) -> TenantRecord:
        """Remove one budget of the tenant (a no-op when it has none).

        Same as ``set(tenant, budgets={resource: None})``; see :meth:`set`.
        """
        return await self.set(tenant, budgets={resource: None})

    async def get(self, tenant: str) -> TenantRecord:
        """Read one tenant with its live counts and budgets.

        Raises:
            UnknownTenant: no such tenant is registered.
            DatabaseUnavailable: the database cannot be reached.
        """
        row = await self._db.fetch_one("list_tenants", {"tenant": tenant})
        if row is None:
            raise UnknownTenant(f"no tenant {tenant!r}")
        return _record(row)

    async def list(self) -> list[TenantRecord]:
        """Every registered tenant, by name, with its live counts and budgets.

        Raises:
            DatabaseUnavailable: the database cannot be reached.
        """
        return [_record(row) for row in await self._db.fetch_all("list_tenants", {"tenant": None})]


def _positive(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, not {value!r}")
    if value > 2**31 - 1:
        raise ConfigError(f"{what} must be at most {2**31 - 1}, not {value}")


def budget_amount(value: Amount) -> Decimal:
    """A budget's amount, checked: a finite number from 0 to 1e15.

    Raises:
        ValueError: it is not; the message says what it must be (``must be at least 0, not
            '-5'``), for the caller to name where the value came from.
    """
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not {value!r}")
    try:
        amount = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except (decimal.InvalidOperation, TypeError, ValueError):
        raise ValueError(f"must be a number, not {value!r}") from None
    if not amount.is_finite():
        raise ValueError(f"must be a finite number, not {value!r}")
    if amount > Decimal("1e15"):
        raise ValueError(f"must be at most 1e15, not {value!r}")
    if amount < 0:
        raise ValueError(f"must be at least 0, not {value!r}")
    return amount


def _amount(value: Amount, tenant: str, resource: str) -> Decimal:
    try:
        return budget_amount(value)
    except ValueError as exc:
        raise ConfigError(f"budget {resource!r} of tenant {tenant!r} {exc}") from None


def _record(row: DictRow) -> TenantRecord:
    budgets = {
        resource: Budget(amount=amount, used=used, reserved=reserved)
        for resource, amount, used, reserved in zip(
            row["budget_resources"],
            row["budget_amounts"],
            row["budget_used"],
            row["budget_reserved"],
            strict=True,
        )
    }
    return TenantRecord(
        tenant=row["tenant"],
        max_active=row["max_active"],
        weight=row["weight"],
        paused=row["paused"],
        queued=row["queued"],
        leased=row["leased"],
        active=row["active"],
        waiting=row["waiting"],
        budgets=budgets,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
