-- name: submit_tasks
-- Inserts one task per input and wakes idle workers (payload: nothing but ids).
WITH submitted AS (
    INSERT INTO toolkit_tasks
        (tenant, definition_name, definition_version, definition_digest, input, checkpoint)
    SELECT %(tenant)s, %(name)s, %(version)s, %(digest)s, i.input, %(checkpoint)s
    FROM jsonb_array_elements(%(inputs)s::jsonb) WITH ORDINALITY AS i(input, n)
    ORDER BY i.n
    RETURNING id
), events AS (
    INSERT INTO toolkit_task_events (task_id, kind)
    SELECT id, 'submitted' FROM submitted
)
SELECT id, pg_notify('toolkit_wakeup', '') IS NULL AS notified
FROM submitted
ORDER BY id;

-- name: get_task
SELECT id, tenant, definition_name, definition_version, definition_digest, input, state,
       wait_reason, run_at, checkpoint, lease_owner, lease_token, lease_expires_at,
       attempts, result, error, created_at, updated_at, finished_at
FROM toolkit_tasks
WHERE id = %(task_id)s;

-- name: list_tasks
SELECT id, tenant, definition_name, definition_version, definition_digest, input, state,
       wait_reason, run_at, checkpoint, lease_owner, lease_token, lease_expires_at,
       attempts, result, error, created_at, updated_at, finished_at
FROM toolkit_tasks
WHERE (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(name)s::text IS NULL OR definition_name = %(name)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: count_tasks_by_state
SELECT state, count(*) AS n
FROM toolkit_tasks
GROUP BY state
ORDER BY state;

-- name: task_evidence
SELECT id, occurrence, step, handler, idempotent, idempotency_key, record, attempt,
       fencing_token, worker_id, result, error, recorded_at
FROM toolkit_effect_evidence
WHERE task_id = %(task_id)s
ORDER BY id;

-- name: task_events
SELECT id, kind, worker_id, fencing_token, detail, at
FROM toolkit_task_events
WHERE task_id = %(task_id)s
ORDER BY id;

-- name: count_evidence
SELECT record, count(*) AS n
FROM toolkit_effect_evidence
GROUP BY record;

-- name: pending_work_exists
-- True while a task of these definitions is queued (due or not) or leased: what
-- `toolkit run --until-idle` waits for. Waiting tasks (timers, signals) do not count.
SELECT EXISTS (
    SELECT 1 FROM toolkit_tasks
    WHERE state IN ('queued', 'leased')
      AND definition_digest = ANY(%(digests)s::text[])
) AS pending;
