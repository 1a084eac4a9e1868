"""Handlers of the composition examples: a model-call race, a batch map, a parent and child.

They stand in for calls to a model provider and a payment service: deterministic, offline,
and reporting what they use through ``ctx.spend`` so budgets and reservations have something
to count (one token per character of the prompt and the answer).
"""

from __future__ import annotations

import hashlib
from typing import Any

import anyio

from toolkit.application import EffectContext


def _tokens(*texts: str) -> int:
    return sum(len(text) for text in texts)


async def ask_handler(ctx: EffectContext, question: str = "", **_: Any) -> dict[str, Any]:
    """A fast model: answers at once; spends a token per character."""
    answer = f"short answer to {question!r}"
    ctx.spend(tokens=_tokens(question, answer))
    return {"model": "fast", "answer": answer}


async def ask_slow_handler(
    ctx: EffectContext, question: str = "", seconds: float = 2.0, **_: Any
) -> dict[str, Any]:
    """A slow, thorough model: answers after ``seconds``; spends a token per character."""
    await anyio.sleep(seconds)
    answer = f"long, careful answer to {question!r}"
    ctx.spend(tokens=_tokens(question, answer))
    return {"model": "slow", "answer": answer}


async def summarise_handler(ctx: EffectContext, text: Any = None, **_: Any) -> dict[str, Any]:
    """Summarise a value: its first 60 characters."""
    summary = str(text)[:60]
    ctx.spend(tokens=_tokens(summary))
    return {"summary": summary}


async def process_item_handler(ctx: EffectContext, item: Any = None, **_: Any) -> dict[str, Any]:
    """Process one batch item: its digest; spends a token per character of the item."""
    text = str(item)
    ctx.spend(tokens=_tokens(text))
    return {"item": item, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


async def charge_handler(
    ctx: EffectContext, amount: float = 0, currency: str = "EUR", **_: Any
) -> dict[str, Any]:
    """Charge a payment: the receipt is keyed by the idempotency key (safe to repeat)."""
    return {"receipt": ctx.idempotency_key, "amount": amount, "currency": currency}
