-- History export and retention (toolkit/export.py, toolkit/retention.py, docs/history.md).
-- An export reads in one REPEATABLE READ, READ ONLY transaction, so that every table is read
-- from the same snapshot. Each table's rows are those whose time lies in [since, until):
-- tasks and checkpoints by updated_at, events by at, effect evidence by recorded_at; the
-- schedules are a snapshot of every schedule as of the export. The column lists are the export schema (toolkit.history.export.EXPORT_COLUMNS): change both together
-- and bump EXPORT_SCHEMA_VERSION.

-- name: export_begin
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: export_horizon
-- The upper bound of this export, taken by the statement that takes the snapshot. A row
-- stamped before the transaction start (now()) is either committed and visible in this
-- snapshot, or written by a transaction still open, which started before the row's time
-- (xact_start <= statement_timestamp() at the write). So nothing stamped before `until` can
-- commit later: the next export, from `until` on, misses no row. Sessions of other roles
-- show no xact_start; they do not write toolkit tables.
SELECT least(
           now(),
           coalesce((SELECT min(xact_start) FROM pg_stat_activity
                     WHERE datname = current_database()
                       AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend'
                       AND xact_start IS NOT NULL), 'infinity'::timestamptz)
       ) AS until,
       now() AS exported_at,
       (SELECT min(created_at) FROM toolkit_tasks) AS oldest;

-- name: export_utc
SET LOCAL TIME ZONE 'UTC';

-- name: export_tasks
COPY (
    SELECT id, tenant, definition_name, definition_version, definition_digest, state,
           wait_reason, attempts, lease_token, parent_id, idempotency_key, input, result,
           error, created_at, run_at, updated_at, finished_at, schedule_name, scheduled_at,
           tags, parent_occurrence, map_index
    FROM toolkit_tasks
    WHERE updated_at >= %(since)s AND updated_at < %(until)s
    ORDER BY id
) TO STDOUT (FORMAT csv);

-- name: export_events
COPY (
    SELECT id, task_id, kind, worker_id, fencing_token, detail, at
    FROM toolkit_task_events
    WHERE at >= %(since)s AND at < %(until)s
    ORDER BY id
) TO STDOUT (FORMAT csv);

-- name: export_effects
COPY (
    SELECT id, task_id, occurrence, step, handler, idempotent, idempotency_key, record,
           attempt, fencing_token, worker_id, result, error, spend, recorded_at
    FROM toolkit_effect_evidence
    WHERE recorded_at >= %(since)s AND recorded_at < %(until)s
    ORDER BY id
) TO STDOUT (FORMAT csv);

-- name: export_emitted
-- The events emitted in the window (docs/events.md), with the tasks each started, was
-- delivered to and cancelled, as JSON arrays.
COPY (
    SELECT id, tenant, name, key, payload, emitted_at, to_jsonb(started) AS started,
           to_jsonb(delivered) AS delivered, to_jsonb(cancelled) AS cancelled
    FROM toolkit_events
    WHERE emitted_at >= %(since)s AND emitted_at < %(until)s
    ORDER BY id
) TO STDOUT (FORMAT csv);

-- name: export_stream
-- The items handlers published in the window (ctx.publish, docs/progress.md), in order.
COPY (
    SELECT task_id, seq, occurrence, fencing_token, value, published_at
    FROM toolkit_task_stream
    WHERE published_at >= %(since)s AND published_at < %(until)s
    ORDER BY task_id, seq
) TO STDOUT (FORMAT csv);

-- name: export_checkpoints
-- The store keeps only each task's latest checkpoint: an export takes a snapshot of the
-- checkpoints that changed in its window, so a series of exports keeps their history.
COPY (
    SELECT id AS task_id, lease_token, definition_digest, state,
           checkpoint ->> 'cursor' AS cursor, checkpoint ->> 'pending' AS pending,
           checkpoint -> 'wait' AS wait, checkpoint, updated_at
    FROM toolkit_tasks
    WHERE updated_at >= %(since)s AND updated_at < %(until)s
    ORDER BY id
) TO STDOUT (FORMAT csv);

-- name: export_schedules
-- Every schedule with its tick counters as of this snapshot (now(): the export's
-- exported_at), whatever the window: the counters are per schedule, not per task.
COPY (
    SELECT name, definition_name, owner, tenant, cadence, overlap, catchup, paused, fired,
           skipped, missed, caught_up, next_tick, last_tick, created_at, now() AS exported_at
    FROM toolkit_schedules
    ORDER BY name
) TO STDOUT (FORMAT csv);

-- name: prune_candidates
-- One batch of terminal tasks that finished before now - older_than (database time), in id
-- order after %(after_id)s, with their tenants; a task that is the parent of a live task is
-- kept. `exported` tells whether the task's whole history lies inside the exported window
-- [%(exported_from)s, %(exported_until)s): created in it, last updated before its end, and
-- no event or evidence record stamped at or after its end. NULL bounds: nothing was
-- exported. Every sub-select names the task's tenant (a child has its parent's), so a
-- store distributed by tenant runs it on each shard.
SELECT t.id, t.tenant,
       (%(exported_until)s::timestamptz IS NOT NULL
        AND t.created_at >= %(exported_from)s::timestamptz
        AND t.updated_at < %(exported_until)s::timestamptz
        AND NOT EXISTS (SELECT 1 FROM toolkit_task_events e
                        WHERE e.task_id = t.id AND e.tenant = t.tenant
                          AND e.at >= %(exported_until)s::timestamptz)
        AND NOT EXISTS (SELECT 1 FROM toolkit_effect_evidence v
                        WHERE v.task_id = t.id AND v.tenant = t.tenant
                          AND v.recorded_at >= %(exported_until)s::timestamptz)) AS exported
FROM toolkit_tasks t
WHERE t.state IN ('succeeded', 'failed', 'cancelled')
  AND t.finished_at < statement_timestamp() - %(older_than)s * interval '1 second'
  AND t.id > %(after_id)s
  AND NOT EXISTS (SELECT 1 FROM toolkit_tasks c
                  WHERE c.parent_id = t.id AND c.tenant = t.tenant
                    AND c.state IN ('queued', 'leased', 'waiting'))
ORDER BY t.id
LIMIT %(batch)s;

-- name: prune_tasks
-- Deletes one batch of terminal tasks of tenant %(tenant)s (%(ids)s) and every row of
-- theirs: events, effect evidence, signals, callbacks, branch rows, limit slots, event
-- subscriptions and stream items. No foreign key cascades to them (migration 0037); a
-- store distributed by tenant routes this statement to the tenant's shard.
-- Rows another transaction holds are skipped (SKIP LOCKED): a worker is never made to
-- wait, and a task that changed since it was chosen (not terminal any more) is not
-- deleted.
WITH doomed AS (
    SELECT id FROM toolkit_tasks
    WHERE id = ANY(%(ids)s::bigint[]) AND tenant = %(tenant)s
      AND state IN ('succeeded', 'failed', 'cancelled')
    ORDER BY id
    FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM toolkit_task_events
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
    RETURNING 1
), evidence AS (
    DELETE FROM toolkit_effect_evidence
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
    RETURNING 1
), signals AS (
    DELETE FROM toolkit_signals
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
    RETURNING 1
), callbacks AS (
    DELETE FROM toolkit_callbacks
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
), branches AS (
    DELETE FROM toolkit_branches
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
), slots AS (
    DELETE FROM toolkit_limit_slots
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
), subscriptions AS (
    DELETE FROM toolkit_event_subscriptions
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
), stream AS (
    DELETE FROM toolkit_task_stream
    WHERE task_id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
), tasks AS (
    DELETE FROM toolkit_tasks
    WHERE id IN (SELECT id FROM doomed) AND tenant = %(tenant)s
    RETURNING id
)
SELECT (SELECT count(*) FROM tasks) AS tasks,
       (SELECT count(*) FROM events) AS events,
       (SELECT count(*) FROM evidence) AS evidence,
       (SELECT count(*) FROM signals) AS signals;

-- name: prune_emitted_tenants
-- The tenants with events emitted more than %(retention)s seconds ago (and, when
-- %(exported_until)s is given, before it), read without a lock: prune_emitted deletes them
-- tenant by tenant.
SELECT DISTINCT tenant
FROM toolkit_events
WHERE emitted_at < statement_timestamp() - %(retention)s::float8 * interval '1 second'
  AND (%(exported_until)s::timestamptz IS NULL OR emitted_at < %(exported_until)s)
ORDER BY tenant;

-- name: prune_emitted
-- Deletes one batch of tenant %(tenant)s's events emitted more than %(retention)s seconds ago
-- (and, when %(exported_until)s is given, before it: exported), skipping rows another
-- transaction holds; routed to the tenant's shard on a store distributed by tenant. An event
-- key de-duplicates emits for as long as its event is kept.
WITH doomed AS (
    SELECT id FROM toolkit_events
    WHERE tenant = %(tenant)s
      AND emitted_at < statement_timestamp() - %(retention)s::float8 * interval '1 second'
      AND (%(exported_until)s::timestamptz IS NULL OR emitted_at < %(exported_until)s)
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM toolkit_events e USING doomed
    WHERE e.id = doomed.id AND e.tenant = %(tenant)s
    RETURNING 1
)
SELECT count(*) AS emitted FROM gone;

-- name: prune_throttle_tenants
-- The tenants with throttle keys whose next start has passed, read without a lock:
-- prune_throttle_keys deletes them tenant by tenant.
SELECT DISTINCT tenant FROM toolkit_throttle_keys
WHERE next_at < statement_timestamp()
ORDER BY tenant;

-- name: prune_throttle_keys
-- Deletes one batch of tenant %(tenant)s's throttle keys whose next start has passed
-- (docs/flow-control.md): such a row holds no state, since a take on a missing key and on a
-- key whose next start has come both start now (take_throttle_start). Skips rows a submit
-- holds; routed to the tenant's shard on a store distributed by tenant.
WITH doomed AS (
    SELECT definition_name, throttle_key FROM toolkit_throttle_keys
    WHERE tenant = %(tenant)s AND next_at < statement_timestamp()
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM toolkit_throttle_keys k USING doomed d
    WHERE k.tenant = %(tenant)s AND k.definition_name = d.definition_name
      AND k.throttle_key = d.throttle_key
    RETURNING 1
)
SELECT count(*) AS throttle_keys FROM gone;
