"""Handlers of the saga, approval and polling examples.

They serve ``definitions/order-saga-compensated.yaml``, ``approval-callback.yaml`` and
``poll-loop.yaml``, standing in for a stock service, a card processor, a notifier, an
approval tool and a job API: deterministic and offline. Results are derived from the
idempotency key, so calling one again with the same key returns the same answer, as the
real services would.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from toolkit.application import EffectContext

logger = logging.getLogger(__name__)


def _ref(prefix: str, ctx: EffectContext) -> str:
    return prefix + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]


async def reserve_stock_handler(
    ctx: EffectContext, order_id: str, items: list[dict[str, Any]]
) -> dict[str, Any]:
    """Reserve the order's items; the total is what the charge takes."""
    total = round(sum(item["qty"] * item["price"] for item in items), 2)
    return {"reservation_id": _ref("res_", ctx), "order_id": order_id, "total": total}


async def release_stock_handler(ctx: EffectContext, reservation_id: str) -> dict[str, Any]:
    """Compensation of the reservation: release it (releasing twice is harmless)."""
    return {"released": reservation_id}


async def charge_card_handler(ctx: EffectContext, order_id: str, amount: float) -> dict[str, Any]:
    """Charge the card; a charge over 10,000 is declined (the saga then compensates)."""
    if amount > 10_000:
        raise CardDeclined(f"order {order_id}: {amount:.2f} is over the card's limit")
    return {"payment_id": _ref("pay_", ctx), "amount": amount}


async def refund_card_handler(ctx: EffectContext, payment_id: str, amount: float) -> dict[str, Any]:
    """Compensation of the charge: refund it, keyed by the payment."""
    return {"refunded": payment_id, "amount": amount}


async def notify_handler(ctx: EffectContext, to: str, message: str) -> dict[str, Any]:
    """Send a notification (logged)."""
    logger.info("notify %s: %s", to, message, extra={"action": "example_notify"})
    return {"to": to, "sent": True}


async def request_approval_handler(
    ctx: EffectContext, request_id: str, amount: float, reference: str, attempt: int
) -> dict[str, Any]:
    """Ask the approval tool; it answers later with ``toolkit complete TOKEN``."""
    logger.info(
        "approval requested for %s (%s): complete it with `toolkit complete %s --result ...`",
        request_id, reference, ctx.callback_token,
        extra={"action": "example_approval_requested"},
    )  # fmt: skip
    return {"request_id": request_id, "amount": amount, "attempt": attempt}


async def check_status_handler(ctx: EffectContext, job_id: str) -> dict[str, Any]:
    """Ask a job's state: a job id ending in a digit d is done after d checks."""
    checks = int(ctx.occurrence.rsplit("#", 1)[-1])
    needed = int(job_id[-1]) if job_id[-1:].isdigit() else 1
    if checks >= needed:
        return {"state": "done", "result": {"job_id": job_id, "checks": checks}}
    return {"state": "running"}


class CardDeclined(Exception):
    """The card processor declined the charge (a business error: not retried)."""
