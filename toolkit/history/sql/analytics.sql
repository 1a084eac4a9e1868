-- DuckDB SQL over an export folder (toolkit/history.py, docs/history.md). Not run by the
-- store: it reads the views tasks_raw, events_raw, effects_raw, checkpoints_raw,
-- schedules_raw, emitted_raw and stream_raw, which toolkit.history.analytics makes from the Parquet files of every export
-- run (a column an older run's files lack is NULL; export_run is the run a row came from).
-- Times are UTC; durations are in seconds (double); $bucket is a bucket width in seconds.

-- name: view_tasks
-- The latest exported snapshot of each task (a task changed between two runs is in both;
-- of two with the same time, a window exported again, the newer run's).
CREATE OR REPLACE VIEW tasks AS
SELECT * EXCLUDE (export_run) FROM tasks_raw
QUALIFY row_number() OVER (PARTITION BY id ORDER BY updated_at DESC, export_run DESC) = 1;

-- name: view_events
-- Every event once, with its task's tenant and definition.
CREATE OR REPLACE VIEW events AS
SELECT e.*, t.tenant, t.definition_name, t.definition_version
FROM (SELECT * EXCLUDE (export_run) FROM events_raw
      QUALIFY row_number() OVER (PARTITION BY id ORDER BY id) = 1) e
LEFT JOIN tasks t ON t.id = e.task_id;

-- name: view_effects
-- Every effect evidence record once, with its task's tenant and definition.
CREATE OR REPLACE VIEW effects AS
SELECT f.*, t.tenant, t.definition_name, t.definition_version
FROM (SELECT * EXCLUDE (export_run) FROM effects_raw
      QUALIFY row_number() OVER (PARTITION BY id ORDER BY id) = 1) f
LEFT JOIN tasks t ON t.id = f.task_id;

-- name: view_checkpoints
-- Each distinct checkpoint snapshot once (a task's checkpoint as of each export that saw
-- it change).
CREATE OR REPLACE VIEW checkpoints AS
SELECT * EXCLUDE (export_run) FROM checkpoints_raw
QUALIFY row_number() OVER (PARTITION BY task_id, updated_at ORDER BY export_run DESC) = 1;

-- name: view_schedules
-- The newest exported snapshot of each schedule: its tick counters as of that export run
-- (exported_at). A schedule deleted since keeps its last snapshot.
CREATE OR REPLACE VIEW schedules AS
SELECT * EXCLUDE (export_run) FROM schedules_raw
QUALIFY row_number() OVER (PARTITION BY name ORDER BY exported_at DESC, export_run DESC) = 1;

-- name: view_emitted
-- Every event emitted once (docs/events.md), with what it started, reached and cancelled.
CREATE OR REPLACE VIEW emitted AS
SELECT * EXCLUDE (export_run) FROM emitted_raw
QUALIFY row_number() OVER (PARTITION BY id ORDER BY export_run DESC) = 1;

-- name: view_stream
-- Every item handlers published once (docs/progress.md), numbered per task.
CREATE OR REPLACE VIEW stream AS
SELECT * EXCLUDE (export_run) FROM stream_raw
QUALIFY row_number() OVER (PARTITION BY task_id, seq ORDER BY export_run DESC) = 1;

-- name: view_queue_delays
-- One row per claim whose delay the history records. A claim event carries its queue delay
-- (detail.queue_delay, seconds from due to claimed in database time), takeovers included.
-- For claims exported before it did, the due time is derived: the task became due at its
-- submission, a release, a reconciliation, a signal that ended its signal wait, or after
-- the delay of a retry or a budget deferral (claims after a timer, a child wait or an
-- expired lease are then not counted). `seg` numbers the stretches between claims.
CREATE OR REPLACE VIEW queue_delays AS
WITH numbered AS (
    SELECT *,
           coalesce(count(*) FILTER (WHERE kind IN ('claimed', 'recovered')) OVER (
               PARTITION BY task_id ORDER BY id
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS seg
    FROM events
), stretches AS (
    SELECT task_id, seg,
           max(CASE
                   WHEN kind IN ('submitted', 'released', 'reconciled', 'signal_received',
                                 'waiting')
                       THEN "at"
                   WHEN kind IN ('retry_scheduled', 'budget_deferred')
                       THEN "at" + to_microseconds(CAST(
                           coalesce(TRY_CAST(detail ->> 'delay_seconds' AS DOUBLE), 0)
                           * 1000000 AS BIGINT))
               END) AS due_at,
           bool_or(kind = 'waiting'
                   AND (json_exists(detail, '$.timer') OR json_exists(detail, '$.child')))
               AS timed_wait,
           bool_or(kind = 'waiting') AS waited,
           bool_or(kind = 'signal_received') AS signalled
    FROM numbered
    WHERE kind NOT IN ('claimed', 'recovered')
    GROUP BY task_id, seg
)
SELECT c.task_id, c.tenant, c.definition_name, c.definition_version, c.worker_id,
       c.fencing_token, c."at" AS claimed_at, s.due_at,
       greatest(date_diff('microsecond', s.due_at, c."at"), 0) / 1e6 AS delay_seconds
FROM numbered c
JOIN stretches s ON s.task_id = c.task_id AND s.seg = c.seg
WHERE c.kind = 'claimed'
  AND TRY_CAST(c.detail ->> 'queue_delay' AS DOUBLE) IS NULL
  AND s.due_at IS NOT NULL
  AND NOT s.timed_wait
  AND (NOT s.waited OR s.signalled)
UNION ALL
SELECT task_id, tenant, definition_name, definition_version, worker_id, fencing_token,
       "at" AS claimed_at,
       "at" - to_microseconds(CAST(
           greatest(TRY_CAST(detail ->> 'queue_delay' AS DOUBLE), 0) * 1000000 AS BIGINT))
           AS due_at,
       greatest(TRY_CAST(detail ->> 'queue_delay' AS DOUBLE), 0) AS delay_seconds
FROM events
WHERE kind IN ('claimed', 'recovered')
  AND TRY_CAST(detail ->> 'queue_delay' AS DOUBLE) IS NOT NULL;

-- name: view_effect_calls
-- One row per effect outcome (completed or failed evidence) written by the worker that held
-- the lease, with how long the call took by database time: from the previous mark of the
-- same lease (its claim, or the evidence committed before the call) to the outcome's commit.
-- Outcomes an operator recorded (toolkit reconcile) are left out.
CREATE OR REPLACE VIEW effect_calls AS
WITH claims AS (
    SELECT task_id, fencing_token, worker_id, "at"
    FROM events
    WHERE kind IN ('claimed', 'recovered')
), marks AS (
    SELECT task_id, fencing_token, "at", NULL::BIGINT AS effect_id FROM claims
    UNION ALL
    SELECT task_id, fencing_token, recorded_at, id FROM effects
), timed AS (
    SELECT effect_id,
           lag("at") OVER (PARTITION BY task_id, fencing_token
                           ORDER BY "at", effect_id NULLS FIRST) AS previous_at
    FROM marks
)
SELECT f.id, f.task_id, f.tenant, f.definition_name, f.definition_version, f.step,
       f.handler, f.occurrence, f.attempt, f.record, f.idempotent, f.worker_id,
       f.error ->> 'name' AS error_name, timed.previous_at AS started_at, f.recorded_at,
       date_diff('microsecond', timed.previous_at, f.recorded_at) / 1e6 AS seconds
FROM effects f
JOIN timed ON timed.effect_id = f.id
JOIN claims c ON c.task_id = f.task_id AND c.fencing_token = f.fencing_token
             AND c.worker_id = f.worker_id
WHERE f.record IN ('completed', 'failed') AND timed.previous_at IS NOT NULL;

-- name: view_wait_spans
-- One row per durable wait: its reason (from the event that started it), its start, and
-- its end (the next claim, takeover, reconciliation or cancellation of the task); end is
-- NULL for a wait still open at the last export.
CREATE OR REPLACE VIEW wait_spans AS
WITH marked AS (
    SELECT *,
           CASE
               WHEN kind = 'waiting' AND json_exists(detail, '$.signal') THEN 'signal'
               -- (an event wait is a signal wait to its task: wait_reason signal)
               WHEN kind = 'waiting' AND json_exists(detail, '$.event') THEN 'signal'
               WHEN kind = 'waiting' AND json_exists(detail, '$.timer') THEN 'timer'
               WHEN kind = 'waiting' AND json_exists(detail, '$.child') THEN 'child'
               WHEN kind = 'waiting' AND json_exists(detail, '$.callback') THEN 'callback'
               WHEN kind = 'waiting' THEN coalesce(detail ->> 'reason', 'other')
               WHEN kind = 'reconciliation_required' THEN 'reconciliation'
               WHEN kind = 'budget_deferred' THEN 'budget'
               WHEN kind = 'limit_deferred' THEN 'limit'
           END AS reason,
           min(CASE WHEN kind IN ('claimed', 'recovered', 'reconciled', 'cancelled')
                    THEN "at" END) OVER (
               PARTITION BY task_id ORDER BY id
               ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS ended_at
    FROM events
)
SELECT task_id, tenant, definition_name, definition_version, reason,
       detail ->> 'step' AS step, "at" AS started_at, ended_at,
       date_diff('microsecond', "at", ended_at) / 1e6 AS seconds
FROM marked
WHERE reason IS NOT NULL;

-- name: view_schedule_lags
-- One row per task a schedule started: the tick it was started for (scheduled_at) and its
-- tick lag, the task's creation minus that tick, by database time.
CREATE OR REPLACE VIEW schedule_lags AS
SELECT id AS task_id, schedule_name, definition_name, definition_version, tenant, state,
       scheduled_at, created_at,
       greatest(date_diff('microsecond', scheduled_at, created_at), 0) / 1e6 AS lag_seconds
FROM tasks
WHERE schedule_name IS NOT NULL AND scheduled_at IS NOT NULL;

-- name: queue_delay
SELECT time_bucket(to_seconds($bucket), claimed_at) AS bucket,
       definition_name, definition_version, tenant,
       count(*) AS claims,
       quantile_cont(delay_seconds, 0.5) AS p50_seconds,
       quantile_cont(delay_seconds, 0.95) AS p95_seconds,
       quantile_cont(delay_seconds, 0.99) AS p99_seconds,
       max(delay_seconds) AS max_seconds
FROM queue_delays
GROUP BY ALL
ORDER BY bucket, definition_name, definition_version, tenant;

-- name: queue_delay_over_time
SELECT time_bucket(to_seconds($bucket), claimed_at) AS bucket,
       count(*) AS claims,
       quantile_cont(delay_seconds, 0.5) AS p50_seconds,
       quantile_cont(delay_seconds, 0.95) AS p95_seconds,
       quantile_cont(delay_seconds, 0.99) AS p99_seconds
FROM queue_delays
GROUP BY ALL
ORDER BY bucket;

-- name: step_durations
SELECT definition_name, definition_version, step, handler,
       count(*) AS calls,
       count(*) FILTER (WHERE record = 'completed') AS completed,
       count(*) FILTER (WHERE record = 'failed') AS failed,
       avg(seconds) AS mean_seconds,
       quantile_cont(seconds, 0.5) AS p50_seconds,
       quantile_cont(seconds, 0.95) AS p95_seconds,
       max(seconds) AS max_seconds
FROM effect_calls
GROUP BY ALL
ORDER BY definition_name, definition_version, step;

-- name: lease_losses
-- Takeovers: a claim of a task whose lease had expired (its holder lost it). attempts_lost:
-- idempotent effect attempts found begun without a record on such a takeover.
WITH lost AS (
    SELECT task_id, count(*) AS n FROM events WHERE kind = 'attempt_lost' GROUP BY task_id
)
SELECT time_bucket(to_seconds($bucket), e."at") AS bucket,
       e.definition_name, e.definition_version, e.tenant,
       e.detail ->> 'previous_owner' AS lost_by, e.worker_id AS taken_by,
       count(*) AS takeovers,
       count(DISTINCT e.task_id) AS tasks,
       coalesce(sum(lost.n), 0)::BIGINT AS attempts_lost
FROM events e
LEFT JOIN lost ON lost.task_id = e.task_id
WHERE e.kind = 'recovered'
GROUP BY ALL
ORDER BY bucket, e.definition_name, e.definition_version, e.tenant, lost_by;

-- name: retries
SELECT definition_name, definition_version, detail ->> 'step' AS step,
       coalesce(detail -> 'error' ->> 'name', 'unknown') AS error_name,
       count(*) AS retries,
       count(DISTINCT task_id) AS tasks,
       avg(TRY_CAST(detail ->> 'delay_seconds' AS DOUBLE)) AS mean_delay_seconds
FROM events
WHERE kind = 'retry_scheduled'
GROUP BY ALL
ORDER BY retries DESC, definition_name, step, error_name;

-- name: failures
-- Tasks that ended failed or cancelled, by the error they ended with.
SELECT definition_name, definition_version, state,
       coalesce(error ->> 'name', 'unknown') AS error_name,
       error ->> 'step' AS step,
       count(*) AS tasks,
       min(finished_at) AS first_at,
       max(finished_at) AS last_at
FROM tasks
WHERE state IN ('failed', 'cancelled')
GROUP BY ALL
ORDER BY tasks DESC, definition_name, error_name;

-- name: waits
SELECT reason, definition_name, definition_version, tenant,
       count(*) AS waits,
       count(*) FILTER (WHERE ended_at IS NULL) AS open,
       coalesce(sum(seconds), 0) AS total_seconds,
       quantile_cont(seconds, 0.5) AS p50_seconds,
       quantile_cont(seconds, 0.95) AS p95_seconds,
       max(seconds) AS max_seconds
FROM wait_spans
GROUP BY ALL
ORDER BY total_seconds DESC, reason, definition_name;

-- name: budget_spend
-- What effects reported spending (ctx.spend), by tenant and resource. Empty when no
-- evidence record carries a spend.
SELECT f.tenant, s.key AS resource,
       sum(TRY_CAST(s.value AS DOUBLE)) AS spent,
       count(*) AS effects,
       count(DISTINCT f.task_id) AS tasks
FROM effects f, json_each(f.spend) s
WHERE f.spend IS NOT NULL AND json_type(f.spend) = 'OBJECT'
  AND f.record IN ('completed', 'failed')
GROUP BY ALL
ORDER BY f.tenant, resource;

-- name: throughput
-- Tasks that ended per bucket, by how they ended.
SELECT time_bucket(to_seconds($bucket), finished_at) AS bucket,
       definition_name, definition_version, tenant,
       count(*) AS finished,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled
FROM tasks
WHERE finished_at IS NOT NULL
GROUP BY ALL
ORDER BY bucket, definition_name, definition_version, tenant;

-- name: schedules
-- Per schedule: its runs in the export and their tick lag, and the ticks it skipped, missed
-- and caught up by its newest snapshot (NULL when no snapshot holds it).
WITH runs AS (
    SELECT schedule_name, any_value(definition_name) AS definition_name,
           count(*) AS fired,
           quantile_cont(lag_seconds, 0.5) AS p50_seconds,
           quantile_cont(lag_seconds, 0.95) AS p95_seconds,
           max(lag_seconds) AS max_seconds
    FROM schedule_lags
    GROUP BY schedule_name
)
SELECT coalesce(s.name, r.schedule_name) AS schedule,
       coalesce(s.definition_name, r.definition_name) AS definition_name,
       coalesce(r.fired, 0) AS fired,
       r.p50_seconds, r.p95_seconds, r.max_seconds,
       s.skipped, s.missed, s.caught_up
FROM runs r
FULL OUTER JOIN schedules s ON s.name = r.schedule_name
ORDER BY schedule;

-- name: summary
-- Rows and time span of each view.
SELECT 'tasks' AS "table", count(*) AS "rows", min(created_at) AS first_at,
       max(updated_at) AS last_at FROM tasks
UNION ALL
SELECT 'events', count(*), min("at"), max("at") FROM events
UNION ALL
SELECT 'effects', count(*), min(recorded_at), max(recorded_at) FROM effects
UNION ALL
SELECT 'checkpoints', count(*), min(updated_at), max(updated_at) FROM checkpoints
UNION ALL
SELECT 'schedules', count(*), min(created_at), max(exported_at) FROM schedules
UNION ALL
SELECT 'emitted', count(*), min(emitted_at), max(emitted_at) FROM emitted
UNION ALL
SELECT 'stream', count(*), min(published_at), max(published_at) FROM stream;
