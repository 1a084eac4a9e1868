"""The order saga's handlers: reserve stock, review large orders, charge, ship.

The pure functions (:func:`price_order`, :func:`review_order`, :func:`carrier_for`,
:func:`tracking_number`) hold the business rules; the async handlers write the example
application's own tables (``examples.sql``) through ``EffectContext.connection()``:

- ``inventory.reserve`` and ``shipping.ship`` upsert a row keyed by the idempotency key, so
  they are idempotent;
- ``payments.charge`` inserts a message into the outbox ``demo_outbox`` on every call, so it
  is not, and the definition says ``idempotent: false``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.resources
from collections.abc import Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb

from toolkit.application import EffectContext
from toolkit.store.queries import parse_named_blocks

CENT = Decimal("0.01")

#: Orders above this total are rejected at review.
REVIEW_TOTAL_LIMIT = Decimal("25000.00")
#: Lines above this quantity are rejected at review.
REVIEW_QTY_LIMIT = 50

_CARRIERS = {
    "NO": "Posten",
    "SE": "PostNord",
    "DK": "PostNord",
    "FI": "Posti",
    "DE": "DHL",
    "NL": "PostNL",
    "IE": "An Post",
    "GB": "Royal Mail",
}


class OrderError(ValueError):
    """The order cannot be processed as given; retrying will not help."""


class CarrierBusy(RuntimeError):
    """The carrier's booking system asked to try again later: a transient error, retried."""


#: One order in this many finds the carrier busy at its first booking attempt (by its number),
#: so that the demo shows a retried effect.
BUSY_EVERY = 40


def carrier_busy(order_id: str, attempt: int) -> bool:
    """Whether the booking of ``order_id`` meets a busy carrier at ``attempt`` (the first only)."""
    digits = "".join(ch for ch in order_id if ch.isdigit())
    return attempt == 1 and bool(digits) and int(digits) % BUSY_EVERY == 7


@dataclasses.dataclass(frozen=True)
class PricedOrder:
    """An order's lines with their amounts.

    Attributes:
        lines: ``{"sku", "qty", "price", "amount"}`` per item, amounts rounded to cents.
        units: items in total.
        total: the sum of the line amounts.
    """

    lines: tuple[dict[str, Any], ...]
    units: int
    total: Decimal


def money(value: float | str | Decimal) -> Decimal:
    """A money amount as a :class:`~decimal.Decimal` rounded half-up to cents."""
    return Decimal(str(value)).quantize(CENT, rounding=ROUND_HALF_UP)


def price_order(items: Sequence[Mapping[str, Any]]) -> PricedOrder:
    """Price an order's items (``{"sku", "qty", "price"}`` each) in exact decimal arithmetic.

    Raises:
        OrderError: no items, a quantity below 1 or a negative price.
    """
    if not items:
        raise OrderError("an order needs at least one item")
    lines: list[dict[str, Any]] = []
    for item in items:
        qty, price = int(item["qty"]), money(item["price"])
        if qty < 1 or price < 0:
            raise OrderError(f"{item['sku']}: quantity {qty} or price {price} out of range")
        lines.append(
            {
                "sku": str(item["sku"]),
                "qty": qty,
                "price": float(price),
                "amount": float(money(price * qty)),
            }
        )
    total = sum((money(line["amount"]) for line in lines), Decimal("0.00"))
    return PricedOrder(tuple(lines), sum(line["qty"] for line in lines), total)


def review_order(total: float | Decimal, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Review a large order against the shop's rules.

    Rules: the total is at most :data:`REVIEW_TOTAL_LIMIT`, no line has more than
    :data:`REVIEW_QTY_LIMIT` units, no SKU appears on two lines.

    Returns:
        ``{"approved": bool, "reasons": [why not, ...], "risk": 0..1}``; the risk grows with
        the total relative to the limit.
    """
    amount = money(total)
    reasons = []
    if amount > REVIEW_TOTAL_LIMIT:
        reasons.append(f"total {amount} is above the limit {REVIEW_TOTAL_LIMIT}")
    seen: set[str] = set()
    for item in items:
        sku = str(item["sku"])
        if int(item["qty"]) > REVIEW_QTY_LIMIT:
            reasons.append(f"{sku}: quantity {item['qty']} is above {REVIEW_QTY_LIMIT}")
        if sku in seen:
            reasons.append(f"{sku} appears on two lines")
        seen.add(sku)
    risk = min(Decimal(1), amount / REVIEW_TOTAL_LIMIT).quantize(Decimal("0.001"))
    return {"approved": not reasons, "reasons": reasons, "risk": float(risk)}


def carrier_for(country: str) -> str:
    """The carrier shipping to an ISO 3166 country code."""
    return _CARRIERS.get(country.upper(), "DHL Express")


def tracking_number(idempotency_key: str, country: str) -> str:
    """A tracking number that depends only on the idempotency key and the country."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:10].upper()
    return f"RF{digest}{country.upper()}"


# --- the application's tables ------------------------------------------------------------------

_prepared: set[tuple[str, str, str]] = set()


@functools.cache
def _queries() -> dict[str, str]:
    text = (importlib.resources.files("toolkit.examples") / "examples.sql").read_text(
        encoding="utf-8"
    )
    return parse_named_blocks(text)


def _sql(name: str) -> LiteralString:
    """The named block of ``examples.sql`` (SQL text from the package, never built at run time)."""
    return _queries()[name]


def _database_key(conn: psycopg.AsyncConnection[Any]) -> tuple[str, str, str]:
    info = conn.info
    return (info.host, str(info.port), info.dbname)


async def ensure_example_tables(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create the example application's tables if they do not exist (safe to run concurrently).

    Args:
        conn: an autocommit connection to the store's database.
    """
    async with conn.transaction():
        await conn.execute(_sql("lock_tables"))
        await conn.execute(_sql("create_tables"))
    _prepared.add(_database_key(conn))


async def _prepare(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create the tables once per database per process, when a handler first needs them."""
    if _database_key(conn) not in _prepared:
        await ensure_example_tables(conn)


async def _fetch_one(ctx: EffectContext, name: str, params: Mapping[str, Any]) -> tuple[Any, ...]:
    async with ctx.connection() as conn:
        await _prepare(conn)
        cursor = await conn.execute(_sql(name), params)
        row = await cursor.fetchone()
    assert row is not None, f"{name} returns a row"
    return tuple(row)


# --- handlers -----------------------------------------------------------------------------------


async def reserve_handler(
    ctx: EffectContext, order_id: str, customer: str, items: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``inventory.reserve``: price the order and record the reservation (idempotent upsert).

    Returns:
        ``{"reservation_id", "order_id", "lines", "units", "total"}``.
    """
    priced = price_order(items)
    (reservation,) = await _fetch_one(
        ctx,
        "upsert_reservation",
        {
            "key": ctx.idempotency_key,
            "order_id": order_id,
            "customer": customer,
            "items": Jsonb(list(priced.lines)),
            "units": priced.units,
            "total": priced.total,
        },
    )
    return {
        "reservation_id": f"RES-{reservation:06d}",
        "order_id": order_id,
        "lines": len(priced.lines),
        "units": priced.units,
        "total": float(priced.total),
    }


async def review_handler(
    ctx: EffectContext, order_id: str, total: float, items: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``orders.review``: :func:`review_order`, with the order id (pure, idempotent)."""
    return {"order_id": order_id, "reviewer": "auto-review/1"} | review_order(total, items)


async def charge_handler(
    ctx: EffectContext, order_id: str, customer: str, amount: float, currency: str
) -> dict[str, Any]:
    """``payments.charge``: put a payment request into the outbox (NOT idempotent).

    Every call inserts one message; the idempotency key and fencing token go with it so a
    reconciliation can find out whether an interrupted call got through.

    Returns:
        ``{"payment_id", "outbox_id", "amount", "currency"}``.
    """
    value = money(amount)
    payload = {
        "order_id": order_id,
        "customer": customer,
        "amount": str(value),
        "currency": currency,
        "task_id": ctx.task_id,
    }
    (outbox_id,) = await _fetch_one(
        ctx,
        "insert_outbox",
        {
            "key": ctx.idempotency_key,
            "topic": "payments.charge",
            "payload": Jsonb(payload),
            "token": ctx.fencing_token,
        },
    )
    return payment_result(outbox_id, payload)


def payment_result(outbox_id: int, payload: Mapping[str, Any]) -> dict[str, Any]:
    """What ``payments.charge`` returns for its outbox message (``id``, ``payload``).

    Returns:
        ``{"payment_id", "outbox_id", "amount", "currency"}``.
    """
    return {
        "payment_id": f"PAY-{outbox_id:06d}",
        "outbox_id": outbox_id,
        "amount": float(payload["amount"]),
        "currency": payload["currency"],
    }


async def outbox_by_key(
    conn: psycopg.AsyncConnection[Any], key: str
) -> tuple[int, dict[str, Any]] | None:
    """The first payment request written under idempotency key ``key``, or None.

    What a reconciliation asks the payment side: did the interrupted call get through?

    Returns:
        ``(outbox id, payload)``, or None when no call with that key got through.
    """
    await _prepare(conn)
    cursor = await conn.execute(_sql("outbox_by_key"), {"key": key})
    row = await cursor.fetchone()
    return None if row is None else (int(row[0]), dict(row[1]))


async def ship_handler(
    ctx: EffectContext, order_id: str, ship_to: str, payment_id: str
) -> dict[str, Any]:
    """``shipping.ship``: book the shipment (idempotent upsert; the first booking stands).

    Returns:
        ``{"shipment_id", "carrier", "tracking"}``.

    Raises:
        CarrierBusy: at the first attempt of one order in :data:`BUSY_EVERY`; the step's retry
            policy calls again.
    """
    if carrier_busy(order_id, ctx.attempt):
        raise CarrierBusy(f"{carrier_for(ship_to)} is busy; booking {order_id} later")
    shipment_id, carrier, tracking = await _fetch_one(
        ctx,
        "upsert_shipment",
        {
            "key": ctx.idempotency_key,
            "order_id": order_id,
            "ship_to": ship_to,
            "carrier": carrier_for(ship_to),
            "tracking": tracking_number(ctx.idempotency_key, ship_to),
            "payment_id": payment_id,
        },
    )
    return {"shipment_id": f"SHP-{shipment_id:06d}", "carrier": carrier, "tracking": tracking}
