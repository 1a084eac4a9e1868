-- Schedules (docs/schedules.md): made, changed, paused, and fired by workers.

-- fragment: schedule_columns
SELECT s.name, s.definition_name, s.owner, s.owner_version, s.cadence, s.input, s.tenant,
       s.tags, s.overlap, s.catchup, s.catchup_window, s.pause_after_failures, s.paused,
       s.pause_note, s.consecutive_failures, s.next_tick, s.buffered, s.fired, s.skipped,
       s.missed, s.caught_up, s.last_tick, s.created_at, s.updated_at

-- fragment: schedule_unended_runs
-- Joined to toolkit_schedules s: l.live, its runs not ended (null: none). A join to a grouped
-- sub-select, not a sub-select per schedule: Citus refuses a correlated sub-select beside a
-- reference table (the schedules), and runs this one on each shard, then joins.
LEFT JOIN (SELECT t.schedule_name, count(*) AS live FROM toolkit_tasks t
           WHERE t.schedule_name IS NOT NULL AND t.state IN ('queued', 'leased', 'waiting')
           GROUP BY t.schedule_name) l ON l.schedule_name = s.name

-- name: create_schedule
-- A new schedule; its first tick is the cadence's first after database now (%(next_tick)s
-- computed by the caller from database_now). Returns nothing when the name is taken.
INSERT INTO toolkit_schedules
    (name, definition_name, owner, owner_version, cadence, input, tenant, tags, overlap,
     catchup, catchup_window, pause_after_failures, next_tick)
VALUES (%(name)s, %(definition_name)s, %(owner)s, %(owner_version)s, %(cadence)s, %(input)s,
        %(tenant)s, %(tags)s, %(overlap)s, %(catchup)s, %(catchup_window)s,
        %(pause_after_failures)s, %(next_tick)s)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: update_schedule
-- A store-owned schedule's settings, replaced (the caller merged the changes).
UPDATE toolkit_schedules
SET cadence = %(cadence)s, input = %(input)s, tenant = %(tenant)s, tags = %(tags)s,
    overlap = %(overlap)s, catchup = %(catchup)s, catchup_window = %(catchup_window)s,
    pause_after_failures = %(pause_after_failures)s, next_tick = %(next_tick)s,
    updated_at = statement_timestamp()
WHERE name = %(name)s
RETURNING name;

-- name: update_declared_schedule
-- A definition-owned schedule, set to what version %(owner_version)s declares; its pause,
-- counters and buffered ticks stay. Nothing when it is not that definition's.
UPDATE toolkit_schedules
SET owner_version = %(owner_version)s, cadence = %(cadence)s, input = %(input)s,
    tenant = %(tenant)s, tags = %(tags)s, overlap = %(overlap)s, catchup = %(catchup)s,
    catchup_window = %(catchup_window)s, pause_after_failures = %(pause_after_failures)s,
    next_tick = %(next_tick)s, updated_at = statement_timestamp()
WHERE name = %(name)s AND owner = 'definition' AND definition_name = %(definition_name)s
RETURNING name;

-- name: get_schedule
-- include: schedule_columns
, coalesce(l.live, 0) AS live
FROM toolkit_schedules s
-- include: schedule_unended_runs
WHERE s.name = %(name)s;

-- name: list_schedules
-- include: schedule_columns
, coalesce(l.live, 0) AS live
FROM toolkit_schedules s
-- include: schedule_unended_runs
WHERE (%(definition_name)s::text IS NULL OR s.definition_name = %(definition_name)s::text)
ORDER BY s.name;

-- name: delete_schedule
-- Its runs go on (they keep its name); its unfired and buffered ticks are dropped.
DELETE FROM toolkit_schedules WHERE name = %(name)s RETURNING name;

-- name: pause_schedule
UPDATE toolkit_schedules
SET paused = true, pause_note = %(note)s, updated_at = statement_timestamp()
WHERE name = %(name)s
RETURNING name;

-- name: resume_schedule
-- Ticks that came while it was paused do not fire: the next is the first after now
-- (%(next_tick)s); the failure count starts again.
UPDATE toolkit_schedules
SET paused = false, pause_note = NULL, consecutive_failures = 0, buffered = '[]'::jsonb,
    next_tick = %(next_tick)s, updated_at = statement_timestamp()
WHERE name = %(name)s
RETURNING name;

-- name: due_schedules
-- A firing pass: the unpaused schedules of these definitions with a tick due now or a
-- buffered tick, and how many of their runs are live; with database now. Read without
-- locks: fire_schedule decides, by compare-and-set. The live runs are counted for the due
-- schedules only, by their names (one index range each), in a sub-select grouped by name
-- rather than one per schedule: Citus refuses a correlated sub-select beside a reference
-- table (the schedules), and runs this one on each shard.
WITH now AS (SELECT statement_timestamp() AS now), due AS (
    -- include: schedule_columns
    , now.now
    FROM toolkit_schedules s, now
    WHERE NOT s.paused
      AND s.definition_name = ANY(%(names)s::text[])
      AND (s.next_tick <= now.now OR s.buffered <> '[]'::jsonb)
    ORDER BY s.next_tick
    LIMIT %(limit)s
)
SELECT due.*, coalesce(l.live, 0) AS live
FROM due
LEFT JOIN (SELECT t.schedule_name, count(*) AS live FROM toolkit_tasks t
           WHERE t.schedule_name = ANY(ARRAY(SELECT name FROM due))
             AND t.state IN ('queued', 'leased', 'waiting')
           GROUP BY t.schedule_name) l ON l.schedule_name = due.name
ORDER BY due.next_tick;

-- name: next_schedule_tick
-- Seconds until the earliest tick of these definitions' unpaused schedules (null: none).
SELECT extract(epoch FROM min(next_tick) - statement_timestamp())::float8 AS seconds
FROM toolkit_schedules
WHERE NOT paused AND definition_name = ANY(%(names)s::text[]);

-- name: fire_schedule
-- Starts runs of a schedule. For a firing pass's plan (%(expected_next)s given) only if no
-- other pass did first: the schedule row is locked and must be unpaused and still have the
-- next tick and buffered ticks the plan was made from (compare-and-set), else nothing
-- happens; it then gets its next tick and buffered ticks. For a trigger or a backfill
-- (%(expected_next)s null) the schedule just has to exist. Each run in %(runs)s (tick, input,
-- tags, key) becomes a task of the given definition version unless its tenant has a task
-- with that idempotency key: a tick is at most one task, however often it is fired. The
-- schedule's tenant is registered before (register_tenant); a run with a concurrency key
-- is admitted or parked (key_admission: lock_keys ran first, in the same transaction); the
-- rotation's marks: due_marks.
WITH
-- include: due_in_statement
,
-- include: keys_in_statement
, s AS (
    SELECT name, tenant FROM toolkit_schedules
    WHERE name = %(name)s
      AND (%(expected_next)s::timestamptz IS NULL
           OR (NOT paused AND next_tick = %(expected_next)s::timestamptz
               AND buffered = %(expected_buffered)s::jsonb))
    FOR NO KEY UPDATE
), r AS (
    SELECT r.n, r.tick, r.input, r.tags, r.key, r.concurrency_key,
           statement_timestamp() + %(timeout)s::float8 * interval '1 second' AS deadline_at,
           'queued' AS state, NULL::text AS wait_reason, statement_timestamp() AS run_at
    FROM ROWS FROM (jsonb_to_recordset(%(runs)s::jsonb)
                    AS (tick timestamptz, input jsonb, tags jsonb, key text,
                        concurrency_key text)) WITH ORDINALITY
         AS r(tick, input, tags, key, concurrency_key, n)
), key_rows AS (
    SELECT r.n, s.tenant, %(definition_name)s::text AS definition_name, r.concurrency_key,
           %(concurrency_limit)s::int AS concurrency_limit
    FROM r, s
    WHERE r.concurrency_key IS NOT NULL
),
-- include: key_admission
, started AS (
    INSERT INTO toolkit_tasks
        (tenant, definition_name, definition_version, definition_digest, input, checkpoint,
         idempotency_key, deadline_at, tags, schedule_name, scheduled_at, concurrency_key,
         concurrency_limit, priority, trace_parent, key_held, start_after, state, wait_reason,
         run_at)
    SELECT s.tenant, %(definition_name)s, %(version)s, %(digest)s, r.input, %(checkpoint)s,
           r.key, r.deadline_at, r.tags, s.name, r.tick, r.concurrency_key,
           CASE WHEN r.concurrency_key IS NOT NULL THEN %(concurrency_limit)s::int END,
           %(priority)s::smallint, %(trace_parent)s::text,
           -- include: keyed_start
    FROM s
    CROSS JOIN r
    LEFT JOIN key_decided d ON d.n = r.n
    CROSS JOIN due_in_statement
    CROSS JOIN keys_in_statement
    ORDER BY r.n
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, tenant, scheduled_at, run_at, definition_name, concurrency_key, wait_reason
), key_parked AS (
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    SELECT tenant, definition_name, concurrency_key FROM started
    WHERE wait_reason = 'concurrency'
), made_due AS (
    SELECT tenant, run_at AS at FROM started
),
-- include: due_marks
, events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
    SELECT id, tenant, 'submitted', jsonb_build_object('schedule', %(name)s::text, 'tick', scheduled_at,
                                               'version', %(version)s::int)
    FROM started
), updated AS (
    UPDATE toolkit_schedules t
    SET next_tick = coalesce(%(next_tick)s::timestamptz, t.next_tick),
        buffered = coalesce(%(buffered)s::jsonb, t.buffered),
        fired = t.fired + (SELECT count(*) FROM started),
        skipped = t.skipped + %(skipped)s, missed = t.missed + %(missed)s,
        caught_up = t.caught_up + %(caught_up)s,
        last_tick = greatest(t.last_tick, (SELECT max(scheduled_at) FROM started)),
        updated_at = statement_timestamp()
    FROM s
    WHERE t.name = s.name
    RETURNING t.name
)
SELECT (SELECT count(*) FROM updated) AS applied,
       coalesce((SELECT jsonb_agg(id ORDER BY id) FROM started), '[]'::jsonb) AS task_ids,
       CASE WHEN EXISTS (SELECT 1 FROM started) THEN '' END AS notify_toolkit_wakeup;

-- name: schedule_live_runs
SELECT id FROM toolkit_tasks
WHERE schedule_name = %(name)s AND state IN ('queued', 'leased', 'waiting')
ORDER BY id;
