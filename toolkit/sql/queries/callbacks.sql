-- name: create_callback
-- Registers the callback token of an effect attempt before its handler runs (so an early
-- completion is never refused), and expires the tokens of earlier attempts of the same
-- occurrence. Fenced: nothing happens unless (worker, token) holds the unexpired lease.
WITH lease AS (
    SELECT id FROM toolkit_tasks
    WHERE id = %(task_id)s
      AND lease_token = %(lease_token)s
      AND lease_owner = %(worker_id)s
      AND state = 'leased'
      AND lease_expires_at > clock_timestamp()
    FOR NO KEY UPDATE
), expired AS (
    UPDATE toolkit_callbacks
    SET state = 'expired'
    WHERE task_id = (SELECT id FROM lease) AND occurrence = %(occurrence)s
      AND state = 'open' AND token <> %(token)s
), created AS (
    INSERT INTO toolkit_callbacks (token, task_id, occurrence, attempt)
    SELECT %(token)s, id, %(occurrence)s, %(attempt)s FROM lease
    ON CONFLICT (token) DO NOTHING
)
SELECT (SELECT id FROM lease) AS task_id;

-- name: get_callback
SELECT c.token, c.task_id, c.occurrence, c.attempt, c.state, c.result, c.error,
       c.created_at, c.completed_at, t.state AS task_state
FROM toolkit_callbacks c
JOIN toolkit_tasks t ON t.id = c.task_id
WHERE c.token = %(token)s;

-- name: complete_callback
-- Completes an open callback once, and wakes its task if it already waits for it.
WITH completed AS (
    UPDATE toolkit_callbacks
    SET state = 'completed', result = %(result)s::jsonb, error = %(error)s::jsonb,
        completed_at = clock_timestamp()
    WHERE token = %(token)s AND state = 'open'
      AND EXISTS (SELECT 1 FROM toolkit_tasks t
                  WHERE t.id = toolkit_callbacks.task_id
                    AND t.state IN ('queued', 'leased', 'waiting'))
    RETURNING task_id, occurrence
), woken AS (
    UPDATE toolkit_tasks t
    SET run_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM completed c
    WHERE t.id = c.task_id AND t.state = 'waiting' AND t.wait_reason = 'callback'
    RETURNING t.id
), events AS (
    INSERT INTO toolkit_task_events (task_id, kind, detail)
    SELECT task_id, 'callback_completed',
           jsonb_build_object('occurrence', occurrence,
                              'outcome', CASE WHEN %(error)s::jsonb IS NULL
                                              THEN 'completed' ELSE 'failed' END)
    FROM completed
)
SELECT task_id, occurrence,
       EXISTS (SELECT 1 FROM woken) AND pg_notify('toolkit_wakeup', '') IS NULL AS woken
FROM completed;

-- name: expire_callback
UPDATE toolkit_callbacks SET state = 'expired' WHERE token = %(token)s AND state = 'open';

-- name: wake_if_completed
-- Run right after a task starts waiting for a callback: a completion that arrived while the
-- task was still leased makes it due at once.
UPDATE toolkit_tasks
SET run_at = clock_timestamp()
WHERE id = %(task_id)s
  AND state = 'waiting'
  AND wait_reason = 'callback'
  AND EXISTS (SELECT 1 FROM toolkit_callbacks
              WHERE token = %(token)s AND state = 'completed')
RETURNING id, pg_notify('toolkit_wakeup', '') IS NULL AS notified;
