"""Handlers of the downstream-limit tests (docs/limits.md), their own :class:`~toolkit.App`.

Every call records itself in ``test_limit_calls`` (database time at its start and end, the
worker's fencing token) and counts how many calls are inside its limit at once in
``test_limit_inside`` (``peak`` is the most ever seen): the ground truth of what the limits
let through, kept outside the task rows. The tables are created by :data:`CREATE_TABLES`.
"""

from __future__ import annotations

from tests.apps.work import slow_call
from toolkit import App, EffectContext

app = App("limited")
app.limit("llm", max_concurrency=3)
app.limit("api", rate="20/s")
app.limit("solo", max_concurrency=1)
app.limit("per_tenant", max_concurrency=1, per="tenant")

CREATE_TABLES = """
CREATE TABLE IF NOT EXISTS test_limit_calls (
    id          bigserial PRIMARY KEY,
    limit_name  text        NOT NULL,
    task_id     bigint      NOT NULL,
    token       bigint      NOT NULL,
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at    timestamptz
);
CREATE TABLE IF NOT EXISTS test_limit_inside (
    limit_name  text    PRIMARY KEY,
    inside      integer NOT NULL,
    peak        integer NOT NULL
);
"""

_ENTER = """
INSERT INTO test_limit_inside AS i (limit_name, inside, peak) VALUES (%s, 1, 1)
ON CONFLICT (limit_name) DO UPDATE SET inside = i.inside + 1, peak = greatest(i.peak, i.inside + 1)
"""
_LEAVE = "UPDATE test_limit_inside SET inside = inside - 1 WHERE limit_name = %s"


async def call(
    ctx: EffectContext, limit: str, seconds: float | None = 0.0, hang_first: float | None = 0.0
) -> dict[str, object]:
    """One call inside ``limit``: enter, record, sleep ``seconds``, leave.

    ``hang_first``: the first attempt sleeps this long instead (a worker to SIGKILL while it
    holds a slot).
    """
    async with ctx.connection() as conn:
        await conn.execute(_ENTER, (limit,))
        cursor = await conn.execute(
            "INSERT INTO test_limit_calls (limit_name, task_id, token, attempt) "
            "VALUES (%s, %s, %s, %s) RETURNING id",
            (limit, ctx.task_id, ctx.fencing_token, ctx.attempt),
        )
        row = await cursor.fetchone()
    assert row is not None
    await slow_call(hang_first if hang_first and ctx.attempt == 1 else seconds or 0.0)
    async with ctx.connection() as conn:
        await conn.execute(_LEAVE, (limit,))
        await conn.execute(
            "UPDATE test_limit_calls SET ended_at = clock_timestamp() WHERE id = %s", (row[0],)
        )
    return {"limit": limit, "call": row[0]}


app.add("lim.llm", call, limits=["llm"])
app.add("lim.api", call, limits=["api"])
app.add("lim.solo", call, limits=["solo"])
app.add("lim.per_tenant", call, limits=["per_tenant"])
app.add("lim.free", call)


def one_step(name: str, handler: str, limit: str) -> str:
    """A one-step workflow calling ``handler`` (args from the input: seconds, hang_first)."""
    return f"""
name: {name}
version: 1
input: {{type: object}}
start: call
steps:
  call:
    effect: {handler}
    idempotent: true
    args:
      limit: {limit}
      seconds: "${{ input.seconds }}"
      hang_first: "${{ input.hang_first }}"
"""
