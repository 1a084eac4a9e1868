"""Debounce and throttle at submit (docs/flow-control.md).

- A debounced submit (``debounce:``) goes to the task of its key that still waits for the key
  to be quiet (state ``waiting``, reason ``debounce``), replacing its input, or makes one:
  one task per burst, with the last input.
- A throttled submit (``throttle:``) first takes a start of its key (GCRA over
  ``toolkit_throttle_keys``): the task is queued now, or waits (reason ``start``) for the
  start it took; past the rate with ``excess: refuse`` the submit is refused.

Both work on a cursor, so that an event's triggers use them inside the emit's transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from toolkit.definition import WorkflowDefinition
from toolkit.errors import InputError, Throttled
from toolkit.store.database import Database
from toolkit.store.queries import query
from toolkit.store.submission import register_tenant, task_params

#: Inserts checked inputs as tasks queued now (``delay`` None) or after ``delay`` seconds.
Queue = Callable[..., Awaitable[list[int]]]


async def submit_flowing(
    db: Database,
    definition: WorkflowDefinition,
    values: Sequence[Any],
    *,
    tenant: str,
    budget: Mapping[str, float] | None,
    timeout: float | None,
    tags: Mapping[str, str] | None,
    queue: Queue,
    priority: int | None = None,
) -> list[int]:
    """Submit checked inputs of a debounced or throttled definition, one by one.

    Returns:
        Per input, the task it went to (a debounced burst gives one task for many).

    Raises:
        Throttled: see `throttle_delay` (the inputs before it were submitted).
        InputError: an input gives no key, or the other submit arguments are not valid.
    """
    ids = []
    for value in values:
        async with db.connection() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            if definition.debounce is not None:
                params = await debounced_params(
                    db, definition, value, tenant=tenant, budget=budget, timeout=timeout,
                    tags=tags, priority=priority,
                )  # fmt: skip
                ids.append((await submit_debounced(db, cursor, params))[0])
                continue
            start_in = await throttle_delay(cursor, definition, tenant, value)
        ids += await queue([value], delay=start_in or None)
    return ids


def no_delayed_start(definition: WorkflowDefinition, start_at: Any, delay: Any) -> None:
    """A debounced or throttled definition decides the start itself.

    Raises:
        InputError: a delayed start was given.
    """
    if start_at is None and delay is None:
        return
    what = "debounce" if definition.debounce is not None else "throttle"
    raise InputError(
        f"{definition.name} v{definition.version} declares {what}, which decides when its tasks"
        " start: give no delayed start (start_at, delay)",
        path="$.start_at",
    )


async def debounced_params(
    db: Database,
    definition: WorkflowDefinition,
    value: Any,
    *,
    tenant: str,
    budget: Mapping[str, float] | None = None,
    timeout: float | None = None,
    tags: Mapping[str, str] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The parameters of ``submit_debounced_task`` for one input (checked).

    Raises:
        InputError: the input, tenant, tags, budget or timeout are not valid, or the input
            gives no debounce key.
    """
    spec = definition.debounce
    assert spec is not None
    params = await task_params(
        db, definition, value, tenant=tenant, budget=budget, timeout=timeout, tags=tags,
        priority=priority,
    )  # fmt: skip
    label = f"{definition.name} v{definition.version}"
    return {
        **params,
        "debounce_key": spec.key_of(params["input"].obj, label),
        "quiet": spec.quiet,
        "max_wait": spec.max_wait,
    }


async def submit_debounced(
    db: Database, cursor: psycopg.AsyncCursor[Any], params: Mapping[str, Any]
) -> tuple[int, bool]:
    """Run ``submit_debounced_task`` on ``cursor`` (of ``db``): ``(task id, created)``.

    Its tenant is registered first, on the same connection (``register_tenant``).
    """
    await register_tenant(db, params["tenant"], cursor.connection)
    await cursor.execute(query("submit_debounced_task"), params)
    row = await cursor.fetchone()
    assert row is not None, "a debounced submit returns the new or the waiting task"
    return int(row["id"]), bool(row["created"])


async def throttle_delay(
    cursor: psycopg.AsyncCursor[Any], definition: WorkflowDefinition, tenant: str, value: Any
) -> float:
    """Take a start of the input's throttle key: seconds until it (0: now).

    Raises:
        Throttled: past the rate with ``excess: refuse`` (nothing taken).
        InputError: the input gives no throttle key.
    """
    spec = definition.throttle
    assert spec is not None
    key = spec.key_of(value, f"{definition.name} v{definition.version}")
    params = {
        "tenant": tenant,
        "name": definition.name,
        "key": key,
        "interval": spec.period / spec.calls,
        "period": spec.period,
        "calls": spec.calls,
        "delay": spec.excess == "delay",
    }
    await cursor.execute(query("take_throttle_start"), params)
    row = await cursor.fetchone()
    if row is not None:
        return float(row["start_in"])
    await cursor.execute(query("throttle_free_in"), params)
    free = await cursor.fetchone()
    retry_after = float(free["free_in"]) if free is not None else 0.0
    raise Throttled(
        f"{definition.name}: throttle key {key!r} is past its rate "
        f"({spec.calls:g} per {spec.period:g} s); a start is free in {retry_after:.1f} s "
        "(excess: refuse)",
        key=key,
        retry_after=retry_after,
    )
