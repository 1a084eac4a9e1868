"""Concurrency keys at submit: the ``on_conflict`` policies (docs/flow-control.md).

The store admits keyed tasks by itself (a keyed task takes a free key at its insert, or
waits for it: ``toolkit.store.key_locks``; claimers admit waiting tasks in submission order
while a key has room: ``toolkit_admit_keys``), so ``queue`` needs nothing here. The other policies
look at the key's live tasks (committed ones: two submits racing for a free key are both
accepted, and queue; the limit holds either way): ``skip`` refuses the submit,
``cancel_newest`` cancels the new task at once and ``cancel_running`` cancels the key's older
live tasks, both through the ordinary cancel path (:meth:`Tasks.cancel
<toolkit.store.tasks.Tasks.cancel>`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from toolkit.definition import WorkflowDefinition
from toolkit.errors import ConcurrencyKeyBusy, TaskTerminal
from toolkit.store.database import Database

#: Cancels a task for a reason (``Tasks.cancel``).
Cancel = Callable[[int, str], Awaitable[str]]


async def live_tasks(
    db: Database, tenant: str, name: str, key: str, limit: int | None = None
) -> list[int]:
    """The live tasks of a key value, oldest first: its holders, then those waiting for it.

    Args:
        db: the database.
        tenant: the tenant (keys are per tenant and definition name).
        name: the definition name.
        key: the key value.
        limit: at most this many of each (None: all).
    """
    rows = await db.fetch_all(
        "key_live_tasks", {"tenant": tenant, "name": name, "key": key, "limit": limit}
    )
    return [row["id"] for row in rows]


async def refused_or_cancelled(
    db: Database, definition: WorkflowDefinition, tenant: str, keys: Sequence[str | None]
) -> set[int]:
    """Before a submit: which of its tasks (indexes of ``keys``) ``cancel_newest`` cancels.

    Tasks of one batch count against each other in order.

    Raises:
        ConcurrencyKeyBusy: ``on_conflict: skip`` and a key is at ``max_active``.
    """
    spec = definition.concurrency
    if spec is None or spec.on_conflict not in ("skip", "cancel_newest"):
        return set()
    live: dict[str, list[int]] = {}
    cancelled = set()
    for index, key in enumerate(keys):
        if key is None:
            continue
        if key not in live:
            live[key] = await live_tasks(db, tenant, definition.name, key, spec.max_active)
        if len(live[key]) < spec.max_active:
            live[key].append(-1)  # this batch's task takes a place
            continue
        if spec.on_conflict == "skip":
            holders = tuple(task for task in live[key] if task > 0)
            shown = ", ".join(str(task) for task in holders) or "earlier tasks of this submit"
            raise ConcurrencyKeyBusy(
                f"{definition.name}: concurrency key {key!r} has {spec.max_active} live "
                f"task(s) (max_active {spec.max_active}): {shown}; not submitted "
                "(on_conflict: skip)",
                key=key,
                holders=holders,
            )
        cancelled.add(index)
    return cancelled


async def apply_policy(
    db: Database,
    definition: WorkflowDefinition,
    tenant: str,
    keys: Sequence[str | None],
    ids: Sequence[int],
    cancel_newest: set[int],
    cancel: Cancel,
) -> None:
    """After a submit of tasks ``ids`` (in the order of ``keys``): cancel what the policy says.

    ``cancel_newest``: the new tasks of those indexes. ``cancel_running``: every live task of
    each key older than the newest task submitted with it.
    """
    spec = definition.concurrency
    if spec is None:
        return
    for index in sorted(cancel_newest):
        await _cancel(cancel, ids[index], f"concurrency key {keys[index]!r} is busy")
    if spec.on_conflict != "cancel_running":
        return
    newest = {key: task for key, task in zip(keys, ids, strict=True) if key is not None}
    for key, task in newest.items():
        for older in await live_tasks(db, tenant, definition.name, key):
            if older < task:
                await _cancel(cancel, older, f"replaced by task {task} (concurrency key {key!r})")


async def _cancel(cancel: Cancel, task_id: int, reason: str) -> None:
    try:
        await cancel(task_id, reason)
    except TaskTerminal:
        pass  # it ended meanwhile
