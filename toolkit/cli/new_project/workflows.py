"""The handlers of this project's workflows; ``toolkit run --app workflows`` runs them."""

from __future__ import annotations

import toolkit

app = toolkit.App("hello")


@app.effect("hello.greet")
async def greet(ctx: toolkit.EffectContext, name: str) -> dict[str, str]:
    """Greet ``name``.

    A real effect calls another system here, passing it ``ctx.idempotency_key`` so that a
    call repeated after a crash is recognised there and not done twice.
    """
    return {"greeting": f"Hello, {name}!"}
