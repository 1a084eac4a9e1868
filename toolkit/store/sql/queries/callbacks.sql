-- name: create_callback
-- Registers the callback token of an effect attempt before its handler runs (so an early
-- completion is never refused), and expires the tokens of earlier attempts of the same
-- occurrence. Fenced: nothing happens unless the fence's lease holds.
WITH lease AS (
    SELECT t.id, t.tenant FROM toolkit_tasks t
    WHERE t.id = %(task_id)s
      AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s)
    FOR NO KEY UPDATE
), expired AS (
    UPDATE toolkit_callbacks
    SET state = 'expired'
    WHERE task_id = (SELECT id FROM lease) AND tenant = %(tenant)s
      AND occurrence = %(occurrence)s
      AND state = 'open' AND token <> %(callback_token)s
), created AS (
    INSERT INTO toolkit_callbacks (token, task_id, tenant, occurrence, attempt)
    SELECT %(callback_token)s, id, tenant, %(occurrence)s, %(attempt)s FROM lease
    ON CONFLICT (token, tenant) DO NOTHING
)
SELECT (SELECT id FROM lease) AS task_id;

-- name: callback_tenant
-- The tenant of callback %(callback_token)s, for the statements that name it beside the
-- token (an external system completes a callback by its token alone).
SELECT tenant FROM toolkit_callbacks WHERE token = %(callback_token)s;

-- name: get_callback
SELECT c.token, c.task_id, c.occurrence, c.attempt, c.state, c.result, c.error,
       c.created_at, c.completed_at, t.state AS task_state
FROM toolkit_callbacks c
JOIN toolkit_tasks t ON t.id = c.task_id AND t.tenant = %(tenant)s
WHERE c.token = %(callback_token)s AND c.tenant = %(tenant)s;

-- name: complete_callback
-- Completes an open callback once, and wakes its task if it already waits for it. The task
-- row is locked first and whether it waits is read from that latest version, as
-- send_signal does: a wait committed while this statement queued for the row is woken; one
-- committed after this statement is woken by the worker's own commit (wake_raced_waits).
-- The rotation's marks: due_marks.
WITH
-- include: due_in_statement
, target AS (
    SELECT t.id, t.tenant, t.state, t.wait_reason
    FROM toolkit_callbacks c
    JOIN toolkit_tasks t ON t.id = c.task_id AND t.tenant = %(tenant)s
    WHERE c.token = %(callback_token)s AND c.tenant = %(tenant)s
    FOR NO KEY UPDATE OF t
), completed AS (
    UPDATE toolkit_callbacks
    SET state = 'completed', result = %(result)s::jsonb, error = %(error)s::jsonb,
        completed_at = statement_timestamp()
    FROM target
    WHERE token = %(callback_token)s AND toolkit_callbacks.tenant = %(tenant)s
      AND toolkit_callbacks.state = 'open'
      AND target.state IN ('queued', 'leased', 'waiting')
    RETURNING toolkit_callbacks.task_id, toolkit_callbacks.tenant, occurrence
), woken AS (
    UPDATE toolkit_tasks t
    SET run_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM completed c, target, due_in_statement
    WHERE t.id = c.task_id AND t.tenant = %(tenant)s AND target.id = c.task_id
      AND target.state = 'waiting' AND target.wait_reason = 'callback'
    RETURNING t.id, t.tenant, t.run_at
), made_due AS (
    SELECT tenant, run_at AS at FROM woken
),
-- include: due_marks
, events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
    SELECT task_id, tenant, 'callback_completed',
           jsonb_build_object('occurrence', occurrence,
                              'outcome', CASE WHEN %(error)s::jsonb IS NULL
                                              THEN 'completed' ELSE 'failed' END)
    FROM completed
)
SELECT task_id, occurrence,
       EXISTS (SELECT 1 FROM woken) AS woken,
       CASE WHEN EXISTS (SELECT 1 FROM woken) THEN '' END AS notify_toolkit_wakeup
FROM completed;

-- name: expire_callback
UPDATE toolkit_callbacks SET state = 'expired'
WHERE token = %(callback_token)s AND tenant = %(tenant)s AND state = 'open';
