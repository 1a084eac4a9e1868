"""Events: emitted once per key, starting tasks and reaching the waits that match them.

An emit (:meth:`Events.emit`, ``toolkit emit``) is one transaction (docs/events.md): it
records the event (a second emit of the same key is the first event), starts a task for each
trigger of the newest version of each definition that declares one for it, with the
trigger's key as the task's idempotency key (an event whose key names a live task is
delivered to that task instead: signal-with-start), and delivers the event to every live
task subscribed to its correlation. Delivered, an event is a signal of its own name
(``event:NAME``, `toolkit.definition.event_signal`) that the task's wait takes, so a wait
woken, a branch woken, and an event kept until the wait comes are all the signals' rules.

A task subscribes to its correlated waits when its first cycle begins (:meth:`subscribe`),
finding the matching events emitted since it was submitted; emits and subscriptions of one
match take turns on an advisory lock, so that one of the two always sees the other.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from toolkit.definition import (
    Subscription,
    WorkflowDefinition,
    definition_from_body,
    event_signal,
    validate_payload,
)
from toolkit.definition.expressions import is_truthy
from toolkit.errors import ExpressionError, InputError, Throttled
from toolkit.store.callbacks import wake_branches_of
from toolkit.store.database import Database
from toolkit.store.descendants import ended_children
from toolkit.store.filters import TimeBound, time_bound
from toolkit.store.key_locks import lock_keys
from toolkit.store.names import check_event_name, check_tenant
from toolkit.store.queries import query
from toolkit.store.submission import keyed_params, register_tenant, start_params
from toolkit.store.submit_flow import debounced_params, submit_debounced, throttle_delay
from toolkit.store.task_tenants import task_tenant
from toolkit.store.tasks import Tasks, cancel_params

#: The most events ``Events.list`` returns at once.
MAX_LISTED = 1000
#: The longest event key, characters.
MAX_KEY = 1000


@dataclasses.dataclass(frozen=True)
class Emitted:
    """What an emit did.

    Attributes:
        event_id: the event's id (the first one's, for a duplicate key).
        duplicate: the key was emitted before: nothing was done again.
        started: tasks the event started (its triggers).
        delivered: live tasks it was delivered to: those subscribed to its correlation,
            and those a trigger's key named (signal-with-start).
        cancelled: live tasks its match cancelled (their ``cancel_on``): cancelled at once,
            or asked to stop when leased.
        ended: tasks a trigger's key named that had ended: nothing started, nothing
            delivered (as ``submit --key`` returns an ended task).
    """

    event_id: int
    duplicate: bool
    started: tuple[int, ...] = ()
    delivered: tuple[int, ...] = ()
    ended: tuple[int, ...] = ()
    cancelled: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class EventRecord:
    """A stored event (``toolkit events list``)."""

    id: int
    tenant: str
    name: str
    key: str | None
    payload: Any
    emitted_at: datetime.datetime
    started: tuple[int, ...]
    delivered: tuple[int, ...]
    cancelled: tuple[int, ...] = ()


def match_key(fields: Sequence[str], values: Sequence[Any]) -> tuple[str, str]:
    """``(fields, match)`` as a subscription stores them: canonical JSON arrays."""
    return (
        json.dumps(list(fields), separators=(",", ":")),
        json.dumps(list(values), sort_keys=True, separators=(",", ":"), ensure_ascii=False),
    )


class Events:
    """Emit events, subscribe tasks to them, and read them back."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._tasks = Tasks(db)
        self._definitions: dict[str, WorkflowDefinition] = {}

    async def emit(
        self, name: str, payload: Any = None, *, key: str | None = None, tenant: str = "default"
    ) -> Emitted:
        """Record event ``name`` and act on it, in one transaction: durable when it returns.

        Args:
            name: the event's name (letters, digits, ``_ . -``).
            payload: any JSON value; triggers and correlated waits read its fields.
            key: de-duplicates emits: a second emit of ``(tenant, name, key)`` returns the
                first event and does nothing (until retention removes it).
            tenant: the event's tenant: its triggers start tasks of this tenant, and only
                this tenant's tasks match it.

        Returns:
            What the emit did (:class:`Emitted`).

        Raises:
            InputError: a bad name, tenant or payload; a payload the schema a definition
                declares for the event (``events:``) refuses; or a trigger whose expression
                fails on this event or whose input its definition refuses (the message names
                the definition and the trigger, or the schema's; nothing was recorded).
        """
        check_event_name(name, "$.name")
        if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_KEY):
            raise InputError(
                f"an event key is a text of 1 to {MAX_KEY} characters, not {key!r}", path="$.key"
            )
        check_tenant(tenant)
        payload = self._tasks._checked(payload, "event payload")
        params = {"tenant": tenant, "name": name, "key": key, "payload": Jsonb(payload)}
        async with self._db.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(query("insert_event"), params)
            row = await cursor.fetchone()
            if row is None:
                await cursor.execute(query("event_by_key"), params)
                first = await cursor.fetchone()
                assert first is not None, "an event that conflicts on its key exists"
                return Emitted(int(first["id"]), True)
            event_id = int(row["id"])
            context = {"event": name, "event_id": event_id, "tenant": tenant, "key": key}
            scope = {"event": payload, "context": context}
            started, named, ended = await self._trigger(conn, name, scope, tenant, event_id)
            waiting, cancelling = await self._subscribers(conn, name, payload, tenant)
            delivered = sorted({*named, *waiting})
            if delivered:
                delivered = await self._deliver(conn, name, payload, event_id, tenant, delivered)
            cancelled = await self._cancel(conn, name, event_id, tenant, cancelling)
            await cursor.execute(
                query("record_event_outcome"),
                {"event_id": event_id, "tenant": tenant, "started": started,
                 "delivered": delivered, "cancelled": cancelled},
            )  # fmt: skip
        if cancelled:
            await self._tasks.cancel_descendants(cancelled, tenant)
        return Emitted(
            event_id, False, tuple(started), tuple(delivered), tuple(ended), tuple(cancelled)
        )

    async def subscribe(
        self, task_id: int, tenant: str, subscriptions: Sequence[tuple[Subscription, Any]]
    ) -> str | None:
        """Subscribe a starting task to its correlated waits; deliver what came meanwhile.

        Idempotent: a subscription or an event delivered before is not again.

        Args:
            task_id: the task (leased by the caller).
            tenant: its tenant.
            subscriptions: each correlated wait with its match values rendered (a mapping
                of payload field to value).

        Returns:
            The reason to cancel the task now when an event its ``cancel_on`` matches was
            emitted since it was submitted (``"event 12 (order.cancelled)"``), else None.
            Events of its waits emitted meanwhile are delivered now.
        """
        keys = []
        for subscription, values in subscriptions:
            if any(value is None for value in values.values()):
                continue  # a null correlation matches no event (docs/events.md)
            fields = sorted(values)
            keys.append(
                (subscription.event, fields, [values[f] for f in fields], subscription.cancels)
            )
        keys.sort(key=lambda k: (k[0], *match_key(k[1], k[2]), k[3]))
        cancel: str | None = None
        async with self._db.transaction() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            for event, fields, values, _ in keys:
                stored_fields, match = match_key(fields, values)
                await cursor.execute(
                    query("lock_event_match"), {"key": f"{tenant}|{event}|{stored_fields}|{match}"}
                )
            for event, fields, values, cancels in keys:
                stored_fields, match = match_key(fields, values)
                await cursor.execute(
                    query("subscribe_event"),
                    {"tenant": tenant, "name": event, "fields": stored_fields, "match": match,
                     "task_id": task_id, "cancels": cancels,
                     "contains": Jsonb(dict(zip(fields, values, strict=True)))},
                )  # fmt: skip
                for row in await cursor.fetchall():
                    found = row["payload"]  # the containment is a pre-filter: values equal?
                    if match_key(fields, [found.get(field) for field in fields])[1] != match:
                        continue
                    if cancels:
                        cancel = cancel or f"event {row['id']} ({event})"
                    elif not await self._deliver(conn, event, found, row["id"], tenant, [task_id]):
                        continue  # delivered before
                    await cursor.execute(
                        query("record_event_reached"),
                        {"event_id": row["id"], "tenant": tenant, "task_id": task_id,
                         "cancels": cancels},
                    )
        return cancel

    async def unknown_triggers(self, definition: WorkflowDefinition) -> tuple[list[str], list[str]]:
        """The events ``definition`` has triggers for that nothing else knows (typos?).

        An event is known when a definition declares its schema (``events:``), another has
        a trigger for it, a task awaits it, ``definition`` itself awaits or declares it, or
        one was emitted and is still kept.

        Returns:
            ``(unknown, known)``: the trigger events nothing knows, and every known name.
        """
        rows = await self._db.fetch_all("known_events", {"definition": definition.name})
        known = {str(row["name"]) for row in rows} | set(definition.events)
        known |= {sub.event for sub in definition.subscriptions()}
        unknown = []
        for event in sorted({trigger.event for trigger in definition.triggers} - known):
            row = await self._db.fetch_one("event_emitted", {"name": event})
            if row is not None and row["emitted"]:
                known.add(event)
            else:
                unknown.append(event)
        return unknown, sorted(known)

    async def of_task(self, task_id: int, *, tenant: str | None = None) -> list[dict[str, Any]]:
        """The events that started task ``task_id`` or were delivered to it, oldest first.

        Each: ``id``, ``name``, ``emitted_at`` and ``how`` (``started`` or ``delivered``).
        ``tenant``: the task's, if known; else looked up by the id
        (:func:`~toolkit.store.task_tenants.task_tenant`).
        """
        params = {"task_id": task_id, "tenant": await task_tenant(self._db, task_id, tenant)}
        return [dict(r) for r in await self._db.fetch_all("task_event_ids", params)]

    # --- the parts of an emit --------------------------------------------------------------

    async def _trigger(
        self,
        conn: psycopg.AsyncConnection[Any],
        name: str,
        scope: Mapping[str, Any],
        tenant: str,
        event_id: int,
    ) -> tuple[list[int], list[int], list[int]]:
        """Check the payload, then start the tasks the event's triggers start.

        The payload must pass the schema each definition declaring the event gives it.

        Returns:
            ``(started, live named, ended named)``: the tasks started, and those a
            trigger's key named, live or ended.

        Raises:
            InputError: a schema refuses the payload, or a trigger fails on the event.
        """
        started: list[int] = []
        named: list[int] = []
        ended: list[int] = []
        cursor = conn.cursor(row_factory=dict_row)
        await cursor.execute(query("event_use_definitions"), {"name": name})
        uses = [
            (self._definition(row["digest"], row["body"]), row["triggers"])
            for row in await cursor.fetchall()
        ]
        for definition, _ in uses:
            if name in definition.events:
                what = (
                    f"payload of event {name!r} (schema of {definition.name} "
                    f"v{definition.version})"
                )
                validate_payload(definition.events[name], scope["event"], what)
        for definition, triggers in uses:
            if not triggers:
                continue
            for i, trigger in enumerate(definition.triggers):
                if trigger.event != name:
                    continue
                where = f"definition {definition.name} v{definition.version}, triggers[{i}]"
                try:
                    if trigger.when is not None and not is_truthy(trigger.when.render(scope)):
                        continue
                    value = trigger.input.render(scope) if trigger.input else scope["event"]
                    key = trigger.key.render(scope) if trigger.key is not None else None
                except ExpressionError as exc:
                    raise InputError(f"event {name!r} refused: {where}: {exc}") from exc
                if key is None or key == "":
                    key = f"event:{event_id}:{i}"
                elif not isinstance(key, str | int | float) or isinstance(key, bool):
                    raise InputError(
                        f"event {name!r} refused: {where}: its key is {json.dumps(key)}, not a "
                        "string or number"
                    )
                key = f"{definition.name}:{key}"  # the start keys of two definitions differ
                try:
                    if definition.debounce is not None:  # the key is the debounce's
                        params = await debounced_params(self._db, definition, value, tenant=tenant)
                        task_id, created = await submit_debounced(self._db, cursor, params)
                        if created:  # else the burst's waiting task took this input
                            started.append(task_id)
                        continue
                    params = await keyed_params(
                        self._db, definition, value, key=str(key), tenant=tenant
                    )
                    if definition.throttle is not None:
                        value = params["input"].obj  # checked, defaults filled in
                        delay = await throttle_delay(cursor, definition, tenant, value)
                        params.update(start_params(None, delay or None))
                except Throttled:
                    continue  # excess: refuse: this trigger starts nothing, the event stands
                except InputError as exc:
                    raise InputError(f"event {name!r} refused: {where}: {exc}") from exc
                held = [(tenant, definition.name, params["concurrency_key"])]
                await register_tenant(self._db, tenant, cursor.connection)
                locked = await lock_keys(cursor.connection, held if held[0][2] else [])
                await cursor.execute(query("submit_keyed_task"), {**params, **locked})
                task = await cursor.fetchone()
                assert task is not None, "a keyed submit returns the new or the existing task"
                if task["created"]:
                    started.append(int(task["id"]))
                else:
                    await cursor.execute(
                        "SELECT state FROM toolkit_tasks WHERE id = %s", (task["id"],)
                    )
                    state = await cursor.fetchone()
                    live = state is not None and state["state"] not in (
                        "succeeded", "failed", "cancelled")  # fmt: skip
                    (named if live else ended).append(int(task["id"]))
        return started, named, ended

    async def _subscribers(
        self, conn: psycopg.AsyncConnection[Any], name: str, payload: Any, tenant: str
    ) -> tuple[list[int], list[int]]:
        """The live tasks subscribed to the event's correlation, under the match locks.

        Returns:
            ``(waiting, cancelling)``: those whose waits match it, those it cancels.
        """
        if not isinstance(payload, dict):
            return [], []
        cursor = conn.cursor(row_factory=dict_row)
        await cursor.execute(query("event_shapes"), {"name": name})
        matches = []
        for row in await cursor.fetchall():
            fields = json.loads(row["fields"])
            if all(payload.get(field) is not None for field in fields):
                matches.append(match_key(fields, [payload[field] for field in fields]))
        matches.sort()
        for fields_text, match in matches:
            lock = f"{tenant}|{name}|{fields_text}|{match}"
            await cursor.execute(query("lock_event_match"), {"key": lock})
        waiting: set[int] = set()
        cancelling: set[int] = set()
        for fields_text, match in matches:  # statements after the locks: fresh snapshots
            await cursor.execute(
                query("event_subscribers"),
                {"tenant": tenant, "name": name, "fields": fields_text, "match": match},
            )
            for row in await cursor.fetchall():
                (cancelling if row["cancels"] else waiting).add(int(row["task_id"]))
        return sorted(waiting - cancelling), sorted(cancelling)

    async def _cancel(
        self,
        conn: psycopg.AsyncConnection[Any],
        name: str,
        event_id: int,
        tenant: str,
        task_ids: Sequence[int],
    ) -> list[int]:
        """Cancel ``task_ids`` as ``toolkit cancel`` does; those cancelled or asked to stop.

        ``tenant``: theirs, the event's.
        """
        done = []
        cursor = conn.cursor(row_factory=dict_row)
        for task_id in task_ids:
            params = cancel_params(task_id, tenant, f"event {event_id} ({name})")
            await cursor.execute(query("request_cancel"), params)
            row = await cursor.fetchone()
            if row is not None and (row["cancelled"] or row["requested"]):
                done.append(task_id)
                if row["cancelled"]:
                    wake = ended_children([task_id], tenant)
                    assert wake is not None
                    await cursor.execute(query(wake[0]), wake[1])
        return done

    async def _deliver(
        self,
        conn: psycopg.AsyncConnection[Any],
        name: str,
        payload: Any,
        event_id: int,
        tenant: str,
        task_ids: Sequence[int],
    ) -> list[int]:
        """Deliver the event to ``task_ids`` (each once); the tasks it was stored for now.

        ``tenant``: the event's, and the tasks'.
        """
        signal = event_signal(name)
        cursor = conn.cursor(row_factory=dict_row)
        await cursor.execute(
            query("deliver_event"),
            {"task_ids": list(task_ids), "tenant": tenant, "name": signal,
             "payload": Jsonb(payload), "event_id": event_id, "address": None, "plan_id": None,
             "operator": None},
        )  # fmt: skip
        sent = [int(row["task_id"]) for row in await cursor.fetchall()]
        wake = wake_branches_of([(task_id, f"signal:{signal}", None) for task_id in sent], tenant)
        if wake is not None:
            await cursor.execute(query(wake[0]), wake[1])
        return sent

    def _definition(self, digest: str, body: Mapping[str, Any]) -> WorkflowDefinition:
        if digest not in self._definitions:  # a registered version never changes
            self._definitions[digest] = definition_from_body(body)
        return self._definitions[digest]

    async def list(
        self,
        *,
        name: str | None = None,
        tenant: str | None = None,
        since: TimeBound | None = None,
        limit: int = 100,
    ) -> list[EventRecord]:
        """Stored events, newest first: of ``name`` and ``tenant``, since ``since``.

        Args:
            name: events of this name; None: any.
            tenant: events of this tenant; None: any.
            since: emitted at or after: a time, or a duration before now (``"1h"``, seconds).
            limit: at most this many (and at most :data:`MAX_LISTED`).

        Raises:
            InputError: ``since`` is neither a time nor a duration.
        """
        if since is not None:
            since = time_bound(since, "since", await self._tasks.database_now())
        rows = await self._db.fetch_all(
            "list_events",
            {"name": name, "tenant": tenant, "since": since, "limit": min(limit, MAX_LISTED)},
        )
        return [_record(row) for row in rows]


def _record(row: Mapping[str, Any]) -> EventRecord:
    return EventRecord(
        int(row["id"]), row["tenant"], row["name"], row["key"], row["payload"],
        row["emitted_at"], tuple(row["started"]), tuple(row["delivered"]),
        tuple(row["cancelled"]),
    )  # fmt: skip
