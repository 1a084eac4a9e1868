-- Events (issue 21; docs/events.md): emit, triggers, and delivery to correlated waits.

-- name: insert_event
-- A new event, or nothing when (tenant, name, key) was emitted before (its key de-duplicates
-- it); a concurrent emit of the same key waits for the first and then inserts nothing.
INSERT INTO toolkit_events (tenant, name, key, payload)
VALUES (%(tenant)s, %(name)s, %(key)s, %(payload)s)
ON CONFLICT (tenant, name, key) WHERE key IS NOT NULL DO NOTHING
RETURNING id, emitted_at;

-- name: event_by_key
SELECT id, tenant, name, key, payload, emitted_at, started, delivered, cancelled
FROM toolkit_events
WHERE tenant = %(tenant)s AND name = %(name)s AND key = %(key)s;

-- name: record_event_outcome
-- What an emit did: the tasks it started, those it was delivered to, those it cancelled.
UPDATE toolkit_events
SET started = %(started)s, delivered = %(delivered)s, cancelled = %(cancelled)s
WHERE id = %(event_id)s AND tenant = %(tenant)s;

-- name: event_use_definitions
-- The definitions whose newest registered version has a trigger for event %(name)s or
-- declares its payload schema, unless that version is retired (it starts no task then, as
-- a submit of it is refused).
SELECT d.name, d.version, d.digest, d.body, u.triggers, u.declares
FROM toolkit_event_uses u
JOIN toolkit_definitions d ON d.name = u.definition_name AND d.version = u.version
WHERE u.event = %(name)s AND d.retired_at IS NULL
ORDER BY d.name;

-- name: sync_event_uses
-- A deploy of definition %(name)s version %(version)s: when it is the newest registered
-- version, the definition's rows become the events it has triggers for (%(triggered)s) or
-- declares (%(declared)s); an older version changes nothing. Rows that are already so are
-- not written again.
WITH newest AS (
    SELECT max(version) AS version FROM toolkit_definitions WHERE name = %(name)s
), wanted AS (
    SELECT e.event, e.event = ANY(%(triggered)s::text[]) AS triggers,
           e.event = ANY(%(declared)s::text[]) AS declares
    FROM (SELECT unnest(%(triggered)s::text[] || %(declared)s::text[])) AS e(event)
    GROUP BY e.event
), gone AS (
    DELETE FROM toolkit_event_uses u
    USING newest
    WHERE u.definition_name = %(name)s AND newest.version = %(version)s
      AND u.event <> ALL (%(triggered)s::text[] || %(declared)s::text[])
)
INSERT INTO toolkit_event_uses (event, definition_name, version, triggers, declares)
SELECT w.event, %(name)s, %(version)s, w.triggers, w.declares
FROM newest, wanted w
WHERE newest.version = %(version)s
ON CONFLICT (event, definition_name) DO UPDATE
SET version = excluded.version, triggers = excluded.triggers, declares = excluded.declares
WHERE (toolkit_event_uses.version, toolkit_event_uses.triggers, toolkit_event_uses.declares)
      IS DISTINCT FROM (excluded.version, excluded.triggers, excluded.declares);

-- name: known_events
-- The event names known beside definition %(definition)s's own triggers: declared by a
-- definition (events:), triggered on by another, or awaited by a task that subscribed.
SELECT event AS name FROM toolkit_event_uses
WHERE declares OR definition_name <> %(definition)s
UNION
SELECT event FROM toolkit_event_shapes
ORDER BY 1;

-- name: event_emitted
-- Whether an event %(name)s is kept, of any tenant: one probe of the events' (tenant, name)
-- index per tenant.
SELECT EXISTS (
    SELECT 1 FROM toolkit_tenants tn
    WHERE EXISTS (SELECT 1 FROM toolkit_events e WHERE e.tenant = tn.tenant AND e.name = %(name)s)
) AS emitted;

-- name: event_shapes
-- The field lists the subscriptions of event %(name)s match on.
SELECT fields FROM toolkit_event_shapes WHERE event = %(name)s ORDER BY fields;

-- name: lock_event_match
-- Emits and subscriptions of one (tenant, event, fields, match) take turns (transaction
-- advisory lock, keyed by %(key)s): the one that comes second runs its next statement in a
-- snapshot that has the first's event or subscription (docs/decisions.md, "Events").
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 7243015772));

-- name: event_subscribers
-- The live tasks of tenant %(tenant)s subscribed to event %(name)s matching on %(fields)s
-- with values %(match)s (cancels: by their cancel_on): one range of the subscriptions'
-- primary key.
SELECT s.task_id, s.cancels
FROM toolkit_event_subscriptions s
JOIN toolkit_tasks t ON t.id = s.task_id AND t.tenant = s.tenant
WHERE s.tenant = %(tenant)s AND t.tenant = %(tenant)s AND s.event = %(name)s AND s.fields = %(fields)s
  AND s.match = %(match)s
  AND t.state NOT IN ('succeeded', 'failed', 'cancelled')
ORDER BY s.task_id;

-- name: record_event_reached
-- A task that subscribed found event %(event_id)s, emitted before: the event's record says
-- it was delivered to the task (or cancelled it, %(cancels)s), once.
UPDATE toolkit_events
SET delivered = CASE WHEN %(cancels)s THEN delivered ELSE delivered || %(task_id)s::bigint END,
    cancelled = CASE WHEN %(cancels)s THEN cancelled || %(task_id)s::bigint ELSE cancelled END
WHERE id = %(event_id)s AND tenant = %(tenant)s
  AND NOT %(task_id)s::bigint = ANY(delivered || cancelled);

-- name: deliver_event
-- Event %(event_id)s delivered to the live tasks %(task_ids)s (of the event's tenant
-- %(tenant)s) as signal %(name)s with payload %(payload)s, once per task, waking those
-- waiting for it (as send_signal does one signal).
WITH target AS (
    SELECT id, tenant, state, wait_reason, checkpoint
    FROM toolkit_tasks
    WHERE id = ANY(%(task_ids)s::bigint[]) AND tenant = %(tenant)s
    ORDER BY id
    FOR NO KEY UPDATE
), r AS (
    SELECT id AS task_id, %(payload)s::jsonb AS payload FROM target
),
-- include: signal_targets
SELECT task_id, (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended
FROM inserted ORDER BY task_id;

-- name: subscribe_event
-- Task %(task_id)s subscribes to event %(name)s of tenant %(tenant)s matching on %(fields)s
-- with values %(match)s (the subscription and its shape kept once), and reads the events
-- of that match emitted since the task was submitted (%(contains)s: the match as an object,
-- a containment answered by the payload index), oldest first.
WITH subscription AS (
    INSERT INTO toolkit_event_subscriptions (tenant, event, fields, match, task_id, cancels)
    VALUES (%(tenant)s, %(name)s, %(fields)s, %(match)s, %(task_id)s, %(cancels)s)
    ON CONFLICT DO NOTHING
), shape AS (
    INSERT INTO toolkit_event_shapes (event, fields)
    VALUES (%(name)s, %(fields)s)
    ON CONFLICT DO NOTHING
)
SELECT e.id, e.payload
FROM toolkit_events e
JOIN toolkit_tasks t ON t.id = %(task_id)s AND t.tenant = %(tenant)s
WHERE e.tenant = %(tenant)s AND e.name = %(name)s AND e.emitted_at >= t.created_at
  AND e.payload @> %(contains)s::jsonb
ORDER BY e.id;

-- name: list_events
-- Events, newest first, of a name and since a time when given, at most %(limit)s.
SELECT id, tenant, name, key, payload, emitted_at, started, delivered, cancelled
FROM toolkit_events
WHERE (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(since)s::timestamptz IS NULL OR emitted_at >= %(since)s::timestamptz)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: task_event_ids
-- The events delivered to task %(task_id)s, the one that started it, the one that cancelled it.
SELECT e.id, e.name, e.emitted_at, 'delivered' AS how
FROM toolkit_signals s JOIN toolkit_events e ON e.id = s.event_id AND e.tenant = %(tenant)s
WHERE s.task_id = %(task_id)s AND s.tenant = %(tenant)s
UNION ALL
SELECT e.id, e.name, e.emitted_at, 'started'
FROM toolkit_events e
WHERE e.tenant = %(tenant)s AND e.started @> ARRAY[%(task_id)s::bigint]
UNION ALL
SELECT e.id, e.name, e.emitted_at, 'cancelled'
FROM toolkit_events e
WHERE e.tenant = %(tenant)s AND e.cancelled @> ARRAY[%(task_id)s::bigint]
ORDER BY 1;
