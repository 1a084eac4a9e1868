-- name: sync_app_limits
-- Stores the limits an application declares (a worker's start): a new limit is inserted
-- with source 'app'; an existing one is updated only while its source is still 'app' (one
-- an operator changed with `toolkit limits set` keeps the operator's values). Returns the
-- name of every limit the store now holds.
WITH declared AS (
    SELECT *
    FROM unnest(%(names)s::text[], %(max_concurrency)s::integer[], %(rates)s::float8[],
                %(bursts)s::float8[], %(per_tenant)s::boolean[])
         AS d(name, max_concurrency, rate_per_second, burst, per_tenant)
), synced AS (
    INSERT INTO toolkit_limits AS l (name, max_concurrency, rate_per_second, burst, per_tenant)
    SELECT name, max_concurrency, rate_per_second, burst, per_tenant
    FROM declared
    ORDER BY name
    ON CONFLICT (name) DO UPDATE
    SET max_concurrency = excluded.max_concurrency,
        rate_per_second = excluded.rate_per_second,
        burst = excluded.burst,
        per_tenant = excluded.per_tenant,
        updated_at = excluded.updated_at
    WHERE l.source = 'app'
      AND (l.max_concurrency, l.rate_per_second, l.burst, l.per_tenant)
          IS DISTINCT FROM (excluded.max_concurrency, excluded.rate_per_second, excluded.burst,
                            excluded.per_tenant)
    RETURNING l.name
)
SELECT name FROM toolkit_limits
UNION
SELECT name FROM synced;

-- name: set_limit
-- An operator's change (`toolkit limits set`): creates the limit or changes the settings
-- given; a setting given as NULL keeps its value (%(set_max)s / %(set_rate)s: whether
-- max_concurrency / rate is given, NULL then meaning "none"). A limit with a rate and no
-- burst gets one second's worth of tokens (at least 1); removing the rate removes the
-- burst. The source becomes 'operator'. The tasks waiting for it are woken next, tenant
-- by tenant (limit_waiting_tenants, wake_limit_waiters).
INSERT INTO toolkit_limits AS l
    (name, max_concurrency, rate_per_second, burst, per_tenant, source)
VALUES (%(name)s, %(max_concurrency)s::integer, %(rate)s::float8,
        CASE WHEN %(rate)s::float8 IS NULL THEN NULL
             ELSE coalesce(%(burst)s::float8, greatest(%(rate)s::float8, 1)) END,
        coalesce(%(per_tenant)s::boolean, false), 'operator')
ON CONFLICT (name) DO UPDATE
SET max_concurrency = CASE WHEN %(set_max)s::boolean THEN excluded.max_concurrency
                           ELSE l.max_concurrency END,
    rate_per_second = CASE WHEN %(set_rate)s::boolean THEN excluded.rate_per_second
                           ELSE l.rate_per_second END,
    burst = CASE
        WHEN (CASE WHEN %(set_rate)s::boolean THEN excluded.rate_per_second
                   ELSE l.rate_per_second END) IS NULL THEN NULL
        WHEN %(burst)s::float8 IS NOT NULL THEN %(burst)s::float8
        ELSE coalesce(l.burst, greatest(excluded.rate_per_second, 1)) END,
    per_tenant = coalesce(%(per_tenant)s::boolean, l.per_tenant),
    source = 'operator',
    updated_at = excluded.updated_at
RETURNING l.name;

-- name: limit_waiting_tenants
-- The tenants with tasks waiting for limit %(name)s, read without a lock.
SELECT DISTINCT tenant
FROM toolkit_tasks
WHERE state = 'waiting' AND wait_reason = 'limit' AND wait_limit = %(name)s
ORDER BY tenant;

-- name: next_limit_waiters
-- On a store distributed by tenant, after a group commit of tenant %(tenant)s released
-- slots of global limit %(name)s that woke none of its own tasks: the %(n)s tasks of the
-- other tenants waiting for it that are due soonest (read without a lock;
-- wake_limit_waiters then makes them due, tenant by tenant).
SELECT tenant, array_agg(id) AS ids
FROM (
    SELECT tenant, id
    FROM toolkit_tasks
    WHERE state = 'waiting' AND wait_reason = 'limit'
      AND wait_limit = %(name)s AND checkpoint -> 'wait' ->> 'scope' = ''
      AND tenant <> %(tenant)s AND run_at > statement_timestamp()
    ORDER BY run_at
    LIMIT %(n)s
) soonest
GROUP BY tenant
ORDER BY tenant;

-- name: wake_limit_waiters
-- The tasks of tenant %(tenant)s waiting for limit %(name)s (those of %(ids)s alone, when
-- not null) are made due at once and idle workers are woken: after an operator's change of
-- the limit (a raised limit may have room), or a released slot of a global limit on a
-- store distributed by tenant (next_limit_waiters). One statement per tenant (routed to
-- its shard on a store distributed by tenant). The rotation's marks: due_marks.
WITH
-- include: due_in_statement
, woken AS (
    UPDATE toolkit_tasks t
    SET run_at = statement_timestamp()
    FROM due_in_statement
    WHERE t.tenant = %(tenant)s AND t.state = 'waiting' AND t.wait_reason = 'limit'
      AND t.wait_limit = %(name)s
      AND (%(ids)s::bigint[] IS NULL OR t.id = ANY(%(ids)s::bigint[]))
      AND t.run_at > statement_timestamp()
    RETURNING t.tenant, t.run_at
), made_due AS (
    SELECT tenant, run_at AS at FROM woken
),
-- include: due_marks
SELECT count(*) AS woken, CASE WHEN count(*) > 0 THEN '' END AS notify_toolkit_wakeup
FROM woken;

-- name: list_limits
-- Every limit (or the one named by %(name)s) with its settings and its use by scope ('' for
-- a global limit, else the tenant): in_use counts the slots whose task still holds the
-- lease they were taken under (leased, unexpired); tokens is the bucket refilled to now
-- (NULL without a rate); waiting counts tasks waiting for the limit. Scopes with nothing in
-- use, no waiting task and a full bucket are left out.
WITH lim AS (
    SELECT * FROM toolkit_limits WHERE %(name)s::text IS NULL OR name = %(name)s
), slots AS (
    SELECT s.name, s.scope, count(*) AS in_use
    FROM toolkit_limit_slots s
    JOIN lim ON lim.name = s.name
    JOIN toolkit_tasks t ON t.id = s.task_id AND t.tenant = s.tenant AND t.lease_token = s.token
    WHERE t.state = 'leased' AND t.lease_expires_at > statement_timestamp()
    GROUP BY s.name, s.scope
), waits AS (
    SELECT t.wait_limit AS name,
           coalesce(t.checkpoint -> 'wait' ->> 'scope', '') AS scope, count(*) AS waiting
    FROM toolkit_tasks t
    WHERE t.state = 'waiting' AND t.wait_reason = 'limit'
      AND t.wait_limit IN (SELECT name FROM lim)
    GROUP BY 1, 2
), buckets AS (
    SELECT b.name, b.scope,
           CASE WHEN lim.rate_per_second IS NOT NULL
                THEN least(lim.burst, b.tokens + lim.rate_per_second * greatest(
                         extract(epoch FROM statement_timestamp() - b.refreshed_at), 0)) END
               AS tokens
    FROM toolkit_limit_buckets b
    JOIN lim ON lim.name = b.name
), scopes AS (
    SELECT name, scope FROM slots
    UNION SELECT name, scope FROM waits
    UNION SELECT b.name, b.scope FROM buckets b JOIN lim ON lim.name = b.name
          WHERE b.tokens < lim.burst
), use AS (
    SELECT sc.name,
           jsonb_object_agg(sc.scope, jsonb_build_object(
               'in_use', coalesce(sl.in_use, 0),
               'waiting', coalesce(wt.waiting, 0),
               'tokens', bu.tokens) ORDER BY sc.scope) AS scopes,
           sum(coalesce(sl.in_use, 0)) AS in_use,
           sum(coalesce(wt.waiting, 0)) AS waiting
    FROM scopes sc
    LEFT JOIN slots sl ON sl.name = sc.name AND sl.scope = sc.scope
    LEFT JOIN waits wt ON wt.name = sc.name AND wt.scope = sc.scope
    LEFT JOIN buckets bu ON bu.name = sc.name AND bu.scope = sc.scope
    GROUP BY sc.name
)
SELECT lim.name, lim.max_concurrency, lim.rate_per_second, lim.burst, lim.per_tenant,
       lim.source, lim.created_at, lim.updated_at,
       coalesce(use.in_use, 0)::bigint AS in_use, coalesce(use.waiting, 0)::bigint AS waiting,
       coalesce(use.scopes, '{}') AS scopes
FROM lim
LEFT JOIN use ON use.name = lim.name
ORDER BY lim.name;

-- name: lease_for_limits
-- The first statements of a batch of acquisitions, one per task: the task's row while its
-- fence's lease holds (no row otherwise: the lease is lost). Not locked: a heartbeat
-- renewing the lease meanwhile must not wait for the scopes' locks. A claim that takes the
-- lease over before the batch commits leaves the slot under the old token, which does not
-- count, and the new lease's acquisition of the same scope waits for the batch's lock, so
-- its slot is written after (docs/limits.md). Routed to the tenant's shard on a store
-- distributed by tenant.
SELECT t.id
FROM toolkit_tasks t
WHERE t.id = %(task_id)s AND t.tenant = %(tenant)s
  AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s);

-- name: add_limit_buckets
-- When lock_limit_scopes found a limit without a bucket for a scope it was asked for (its
-- first acquisition there): a bucket row for each limit's scope ('' for a global limit, the
-- tenant for a per-tenant one) that has none yet, of the pairs %(names)s / %(tenants)s (a
-- limit name and the tenant of the task asking), inserted in (name, scope) order (a full
-- bucket), so that lock_limit_scopes, run again, locks it. A statement of its own: the
-- buckets are a reference table on a store distributed by tenant, which Citus changes on
-- every node.
INSERT INTO toolkit_limit_buckets (name, scope, tokens)
SELECT DISTINCT l.name, CASE WHEN l.per_tenant THEN r.tenant ELSE '' END, coalesce(l.burst, 0)
FROM unnest(%(names)s::text[], %(tenants)s::text[]) AS r(name, tenant)
JOIN toolkit_limits l ON l.name = r.name
WHERE NOT EXISTS (SELECT 1 FROM toolkit_limit_buckets b
                  WHERE b.name = l.name
                    AND b.scope = CASE WHEN l.per_tenant THEN r.tenant ELSE '' END)
ORDER BY 1, 2
ON CONFLICT (name, scope) DO NOTHING;

-- name: lock_limit_scopes
-- Locks the bucket row of each scope asked for by the pairs %(names)s / %(tenants)s (a limit
-- name and the tenant of the task asking; the scope is '' for a global limit, else the
-- tenant), in (name, scope) order: acquisitions of one scope take turns, so the statement
-- that follows (a fresh snapshot) sees every slot and token the previous ones took. A
-- limit missing from the store is left out (it limits nothing).
SELECT b.name, b.scope
FROM toolkit_limit_buckets b
JOIN toolkit_limits l ON l.name = b.name
WHERE EXISTS (SELECT 1 FROM unnest(%(names)s::text[], %(tenants)s::text[]) AS r(name, tenant)
              WHERE r.name = b.name
                AND b.scope = CASE WHEN l.per_tenant THEN r.tenant ELSE '' END)
ORDER BY b.name, b.scope
FOR NO KEY UPDATE OF b;

-- name: limit_scope_state
-- For each scope asked for by the pairs %(names)s / %(tenants)s whose bucket
-- lock_limit_scopes locked ('' for a global limit, else the tenant; a limit without a bucket
-- there is left out): the settings; in_use, the live slots (a slot counts while its task
-- holds the lease it was taken under); stale, the other slots but those of the tasks
-- %(task_ids)s asking, whose lease is gone; first_free_seconds, when the earliest live lease
-- expires (seconds from now); tokens, the bucket refilled to now; waiting, the tasks waiting
-- for the limit in this scope; and the database's now. Sent right behind the locks, before
-- their rows are read (one round trip): the statement's snapshot is taken once the locks
-- are granted, so it sees every slot and token the acquisitions before it took. The slots
-- and the waiting tasks are counted grouped, then joined to the scopes (a store
-- distributed by tenant counts them on every shard: a global limit's slots are any
-- tenant's).
WITH asked AS (
    SELECT DISTINCT l.name, b.scope
    FROM unnest(%(names)s::text[], %(tenants)s::text[]) AS r(name, tenant)
    JOIN toolkit_limits l ON l.name = r.name
    JOIN toolkit_limit_buckets b
      ON b.name = l.name AND b.scope = CASE WHEN l.per_tenant THEN r.tenant ELSE '' END
), live AS (
    SELECT x.name, x.scope,
           count(t.id) AS in_use,
           count(*) FILTER (WHERE t.id IS NULL AND x.task_id <> ALL(%(task_ids)s::bigint[]))
               AS stale,
           extract(epoch FROM min(t.lease_expires_at) - statement_timestamp())::float8
               AS first_free_seconds
    FROM toolkit_limit_slots x
    LEFT JOIN toolkit_tasks t
      ON t.id = x.task_id AND t.tenant = x.tenant AND t.lease_token = x.token
     AND t.state = 'leased' AND t.lease_expires_at > statement_timestamp()
    JOIN asked a ON a.name = x.name AND a.scope = x.scope
    WHERE x.name = ANY(%(names)s::text[])
    GROUP BY x.name, x.scope
), waits AS (
    SELECT w.wait_limit AS name, w.checkpoint -> 'wait' ->> 'scope' AS scope,
           count(*) AS waiting
    FROM toolkit_tasks w
    WHERE w.state = 'waiting' AND w.wait_reason = 'limit'
      AND w.wait_limit = ANY(%(names)s::text[])
    GROUP BY 1, 2
)
SELECT s.name, s.scope, l.per_tenant, l.max_concurrency, l.rate_per_second, l.burst,
       coalesce(live.in_use, 0) AS in_use, coalesce(live.stale, 0) AS stale,
       live.first_free_seconds,
       CASE WHEN l.rate_per_second IS NOT NULL
            THEN least(l.burst, b.tokens + l.rate_per_second * greatest(
                     extract(epoch FROM statement_timestamp() - b.refreshed_at), 0)) END AS tokens,
       coalesce(waits.waiting, 0) AS waiting,
       statement_timestamp() AS now
FROM asked s
JOIN toolkit_limits l ON l.name = s.name
JOIN toolkit_limit_buckets b ON b.name = s.name AND b.scope = s.scope
LEFT JOIN live ON live.name = s.name AND live.scope = s.scope
LEFT JOIN waits ON waits.name = s.name AND waits.scope = s.scope
ORDER BY s.name, s.scope;

-- name: limit_slots_held
-- The slots the tasks %(task_ids)s of tenants %(tenants)s hold of the limits %(names)s, with
-- the occurrence and the lease token each was taken under: an occurrence that already
-- holds a slot under its lease (a call sent again after a lost connection) takes none.
SELECT x.task_id, x.occurrence, x.name, x.token
FROM toolkit_limit_slots x
WHERE x.task_id = ANY(%(task_ids)s::bigint[]) AND x.tenant = ANY(%(tenants)s::text[])
  AND x.name = ANY(%(names)s::text[]);

-- name: take_limit_tokens
-- Takes %(counts)s tokens of each bucket in %(rated)s with scopes %(rated_scopes)s (refilled
-- to now first), their scopes locked by lock_limit_scopes. (The time is read in a CTE:
-- Citus takes no stable function of a column in an UPDATE.)
WITH clock AS (
    SELECT statement_timestamp() AS now_at
), rated AS (
    SELECT *
    FROM unnest(%(rated)s::text[], %(rated_scopes)s::text[], %(counts)s::float8[])
         AS r(name, scope, taken)
)
UPDATE toolkit_limit_buckets b
SET tokens = least(l.burst, b.tokens + l.rate_per_second * greatest(
                 extract(epoch FROM c.now_at - b.refreshed_at), 0)) - r.taken,
    refreshed_at = c.now_at
FROM rated r, toolkit_limits l, clock c
WHERE b.name = r.name AND b.scope = r.scope AND l.name = r.name;

-- name: delete_stale_limit_slots
-- Before slots of the limits %(slotted)s (scopes %(slotted_scopes)s) are taken, when
-- limit_scope_state counted stale ones: their slots whose task's lease is gone are deleted,
-- but those of the tasks %(task_ids)s taking slots now (the scopes are locked by
-- lock_limit_scopes). A statement of its own: on a store distributed by tenant a global
-- limit's slots are any tenant's, on every shard, while the slots taken go to the tasks'.
DELETE FROM toolkit_limit_slots x
WHERE x.name = ANY(%(slotted)s::text[]) AND x.scope = ANY(%(slotted_scopes)s::text[])
  AND x.task_id <> ALL(%(task_ids)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM toolkit_tasks t
                  WHERE t.id = x.task_id AND t.tenant = x.tenant AND t.lease_token = x.token
                    AND t.state = 'leased' AND t.lease_expires_at > statement_timestamp());

-- name: take_limit_slots
-- Takes the slots of a batch of acquisitions: for each row of the arrays, a slot of limit
-- %(names)s in scope %(scopes)s for occurrence %(occurrences)s of task %(task_ids)s of tenant
-- %(tenants)s under lease %(tokens)s (a slot left by an earlier lease of the same
-- occurrence is taken over), their scopes locked by lock_limit_scopes.
INSERT INTO toolkit_limit_slots (task_id, tenant, occurrence, name, scope, token)
SELECT *
FROM unnest(%(task_ids)s::bigint[], %(tenants)s::text[], %(occurrences)s::text[],
            %(names)s::text[], %(scopes)s::text[], %(tokens)s::bigint[])
ON CONFLICT (task_id, occurrence, name, tenant) DO UPDATE
-- excluded.acquired_at: the statement's time, its column default (Citus takes no function
-- but an immutable one here)
SET scope = excluded.scope, token = excluded.token, acquired_at = excluded.acquired_at;

-- name: limit_health
-- Per limit, for `toolkit doctor`: live slots in use, tasks waiting for it, and how long
-- the longest of them has waited (seconds since its first deferral, database time). Each
-- count is grouped by limit over the tasks once, then joined to the limits (a store
-- distributed by tenant runs each on every shard: it takes no join of a limit to tasks).
WITH in_use AS (
    SELECT x.name, count(*) AS in_use
    FROM toolkit_limit_slots x
    JOIN toolkit_tasks t ON t.id = x.task_id AND t.tenant = x.tenant
     AND t.lease_token = x.token
    WHERE t.state = 'leased' AND t.lease_expires_at > statement_timestamp()
    GROUP BY x.name
), waits AS (
    SELECT t.wait_limit AS name, count(*) AS waiting,
           extract(epoch FROM statement_timestamp() - min(coalesce(
               (t.checkpoint -> 'wait' ->> 'since')::timestamptz, t.updated_at)))::float8
               AS oldest_wait
    FROM toolkit_tasks t
    WHERE t.state = 'waiting' AND t.wait_reason = 'limit'
    GROUP BY 1
)
SELECT l.name, l.max_concurrency, l.rate_per_second,
       coalesce(u.in_use, 0)::bigint AS in_use, coalesce(w.waiting, 0)::bigint AS waiting,
       w.oldest_wait
FROM toolkit_limits l
LEFT JOIN in_use u ON u.name = l.name
LEFT JOIN waits w ON w.name = l.name
ORDER BY l.name;
