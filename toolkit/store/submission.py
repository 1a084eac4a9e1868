"""What a new task is made of: its checked input, first checkpoint, tags, deadline and start.

Shared by every way a task is submitted: ``Tasks.submit`` and ``submit_keyed``, and an
event's triggers, which submit inside the emit's own transaction (docs/events.md).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from toolkit.checkpoint import Checkpoint
from toolkit.definition import WorkflowDefinition
from toolkit.durations import MAX_SECONDS
from toolkit.errors import InputError, PayloadRefused
from toolkit.payload import check_payload
from toolkit.store.concurrency_keys import Cancel, apply_policy, refused_or_cancelled
from toolkit.store.database import Database
from toolkit.store.key_locks import insert_keyed
from toolkit.store.names import check_tenant
from toolkit.store.queries import query
from toolkit.store.tags import check_tags, merged_tags
from toolkit.tracing import current_traceparent

#: The largest budget amount a submit may give (and a tenant budget may have): past it,
#: amounts lose their precision as floating point.
MAX_AMOUNT = 1e15


def checked_input(db: Database, definition: WorkflowDefinition, value: Any) -> Any:
    """The input checked against the payload limits, then the input schema."""
    try:
        check_payload(value, db.payload_limits)
    except PayloadRefused as exc:
        raise InputError(
            f"invalid input for {definition.name} v{definition.version}: {exc}",
            path=exc.path,
        ) from exc
    return definition.validate_input(value)


async def initial_checkpoint(
    db: Database, definition: WorkflowDefinition, tenant: str, budget: Mapping[str, float] | None
) -> dict[str, Any]:
    """The checkpoint of a new task, with its budget: the definition's, overridden."""
    limits = {**definition.budget, **(budget or {})}
    if budget:
        for resource, amount in budget.items():
            if (
                isinstance(amount, bool)
                or not isinstance(amount, int | float)
                or not 0 <= amount <= MAX_AMOUNT  # NaN fails this too
            ):
                raise InputError(
                    f"budget {resource!r} must be a number from 0 to {MAX_AMOUNT:g},"
                    f" got {amount!r}",
                    path=f"$.budget.{resource}",
                )
        rows = await db.fetch_all("tenant_budget_amounts", {"tenant": tenant})
        for row in rows:
            wanted = budget.get(row["resource"])
            if wanted is not None and wanted > row["amount"]:
                raise InputError(
                    f"budget {row['resource']!r} of {wanted:g} is over the budget of "
                    f"tenant {tenant!r}, {row['amount']:g}",
                    path=f"$.budget.{row['resource']}",
                )
    return Checkpoint.initial(definition.start, limits).to_json()


#: How many registered tenants a database remembers (register_tenant); past it, it forgets.
_REGISTERED_TENANTS_KEPT = 100_000


async def register_tenant(
    db: Database, tenant: str, conn: psycopg.AsyncConnection[Any] | None = None
) -> None:
    """Make sure ``tenant``'s row is there before a statement inserts tasks of it.

    The statements that insert tasks make the tenant rotation's marks themselves
    (``due_marks``, docs/scaling.md), which lock and read the tenant's row as their snapshot
    has it: a row that another transaction commits while such a statement runs is not there,
    and a claim could take the tenant out of the rotation without seeing the new tasks. So a
    tenant is registered by a statement of its own, after every check of the submit (a
    refused submit writes nothing) and just before the insert: committed by then, or this
    transaction's own and so ready until it commits. Tenant rows are never deleted, so ``db``
    remembers a registration that committed (up to 100,000 tenants).

    Args:
        db: the database the tasks are inserted through.
        tenant: the tenant, already checked.
        conn: the connection that runs the insert, when the caller holds one (inside a
            transaction, the registration is that transaction's: remembered only when the
            connection is not in one). None: one of ``db``'s.

    Raises:
        DatabaseUnavailable: the database cannot be reached (nothing written).
    """
    registered = db.registered_tenants
    if tenant in registered:
        return
    if conn is None:
        await db.execute("register_tenant", {"tenant": tenant})
    else:
        await conn.execute(query("register_tenant"), {"tenant": tenant})
        if conn.info.transaction_status != TransactionStatus.IDLE:
            return  # the transaction may yet roll it back
    if len(registered) >= _REGISTERED_TENANTS_KEPT:
        registered.clear()
    registered.add(tenant)


async def keyed_params(
    db: Database,
    definition: WorkflowDefinition,
    value: Any,
    *,
    key: str,
    tenant: str = "default",
    budget: Mapping[str, float] | None = None,
    timeout: float | None = None,
    tags: Mapping[str, str] | None = None,
    start_at: datetime.datetime | None = None,
    delay: float | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The parameters of ``submit_keyed_task`` for one task (see ``Tasks.submit_keyed``).

    For a caller that submits inside a transaction of its own (an event's triggers).

    Raises:
        InputError: the input, tenant, tags, budget or timeout are not valid.
    """
    params = await task_params(
        db, definition, value, tenant=tenant, budget=budget, timeout=timeout, tags=tags,
        priority=priority,
    )  # fmt: skip
    return {
        **params,
        "key": key,
        **start_params(start_at, delay),
        **concurrency_params(definition, params["input"].obj),
    }


async def task_params(
    db: Database,
    definition: WorkflowDefinition,
    value: Any,
    *,
    tenant: str,
    budget: Mapping[str, float] | None,
    timeout: float | None,
    tags: Mapping[str, str] | None,
    priority: int | None,
) -> dict[str, Any]:
    """What every insert of one task takes: its checked input, tags, checkpoint and settings.

    Raises:
        InputError: the input, tenant, tags, budget, timeout or priority are not valid.
    """
    value = checked_input(db, definition, value)
    return {
        "tenant": check_tenant(tenant),
        "name": definition.name,
        "version": definition.version,
        "digest": definition.digest,
        "input": Jsonb(value),
        "tags": Jsonb(task_tags(definition, value, check_tags(tags or {}))),
        "checkpoint": Jsonb(await initial_checkpoint(db, definition, tenant, budget)),
        "timeout": task_timeout(definition, timeout),
        "priority": task_priority(definition, priority),
        "trace_parent": current_traceparent(),
    }


def concurrency_params(definition: WorkflowDefinition, value: Any) -> dict[str, Any]:
    """The concurrency key and limit of a new task of ``definition`` (None: it has none).

    Raises:
        InputError: the key expression fails or gives no usable key for this input.
    """
    spec = definition.concurrency
    if spec is None:
        return {"concurrency_key": None, "concurrency_limit": None}
    key = spec.key_of(value, f"{definition.name} v{definition.version}")
    return {"concurrency_key": key, "concurrency_limit": spec.max_active}


def start_params(start_at: datetime.datetime | None, delay: float | None) -> dict[str, Any]:
    """The ``start_at`` parameters of a submit.

    Raises:
        InputError: both given, a naive time, or a delay that is not 0 to 100 years.
    """
    if start_at is not None and delay is not None:
        raise InputError("give start_at or delay, not both", path="$.start_at")
    if start_at is not None and (
        not isinstance(start_at, datetime.datetime) or start_at.tzinfo is None
    ):
        raise InputError(f"start_at must be an aware datetime, not {start_at!r}", path="$.start_at")
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, int | float)
        or not 0 <= delay <= MAX_SECONDS
    ):  # fmt: skip
        raise InputError(
            f"delay must be seconds from 0 to 100 years, not {delay!r}", path="$.delay"
        )
    return {"run_at": start_at, "delay": delay}


def task_tags(
    definition: WorkflowDefinition, value: Any, given: Mapping[str, str]
) -> dict[str, str]:
    """A new task's tags: the definition's, from its input, then those the submit gives.

    Raises:
        InputError: a definition tag's expression fails or gives no string, or together
            they are more than the limit.
    """
    return merged_tags(definition.task_tags(value), given)


def task_priority(definition: WorkflowDefinition, override: int | None) -> int:
    """A new task's priority: the override, else the definition's (docs/flow-control.md).

    Raises:
        InputError: the override is not an integer from 0 to 9.
    """
    if override is None:
        return definition.priority
    if isinstance(override, bool) or not isinstance(override, int) or not 0 <= override <= 9:
        raise InputError(f"priority must be an integer from 0 to 9, got {override!r}", path="$")
    return override


def task_timeout(definition: WorkflowDefinition, override: float | None) -> float | None:
    """The workflow timeout of a new task, seconds: the override, else the definition's.

    Raises:
        InputError: the override is not a number > 0.
    """
    if override is None:
        return definition.timeout
    if (
        isinstance(override, bool)
        or not isinstance(override, int | float)
        or not 0 < override <= MAX_SECONDS  # NaN fails this too
    ):
        raise InputError(
            f"timeout must be a number of seconds > 0 and at most 100 years, got {override!r}",
            path="$",
        )
    return float(override)


async def queue_tasks(
    db: Database,
    definition: WorkflowDefinition,
    validated: Sequence[Any],
    *,
    tenant: str,
    budget: Mapping[str, float] | None,
    timeout: float | None,
    tags: Mapping[str, str] | None,
    cancel: Cancel,
    start_at: datetime.datetime | None = None,
    delay: float | None = None,
    priority: int | None = None,
) -> list[int]:
    """Insert one task per checked input (``Tasks.submit`` without debounce or throttle).

    A keyed definition's ``on_conflict`` policy applies (``cancel``: ``Tasks.cancel``).

    Returns:
        The new task ids, in input order.

    Raises:
        InputError: see ``Tasks.submit``.
        ConcurrencyKeyBusy: ``on_conflict: skip`` and a key is busy (nothing written).
    """
    given = check_tags(tags or {})
    tags_of = [task_tags(definition, value, given) for value in validated]
    keys = [concurrency_params(definition, value)["concurrency_key"] for value in validated]
    initial = await initial_checkpoint(db, definition, tenant, budget)
    cancel_newest = await refused_or_cancelled(db, definition, tenant, keys)
    params = {
        "tenant": tenant,
        "name": definition.name,
        "version": definition.version,
        "digest": definition.digest,
        "inputs": Jsonb(list(validated)),
        "tags": Jsonb(tags_of),
        "checkpoint": Jsonb(initial),
        "timeout": task_timeout(definition, timeout),
        "priority": task_priority(definition, priority),
        "concurrency_keys": Jsonb(keys),
        "concurrency_limit": definition.concurrency and definition.concurrency.max_active,
        "trace_parent": current_traceparent(),
        **start_params(start_at, delay),
    }
    await register_tenant(db, tenant)  # every check passed
    held = [(tenant, definition.name, key) for key in keys if key is not None]
    rows = await insert_keyed(db, "submit_tasks", params, held)
    ids = [row["id"] for row in rows]
    await apply_policy(db, definition, tenant, keys, ids, cancel_newest, cancel)
    return ids
