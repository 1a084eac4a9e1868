-- name: publish_item
-- ctx.publish: the next item of the task's stream, under its lease (fenced: nothing is
-- written when the fence does not hold) while the stream has fewer than %(max_items)s
-- items, and a notification naming the task on channel toolkit_stream (readers then read
-- what is new). No row: the fence does not hold, or the stream is full (full says which).
WITH task AS (
    UPDATE toolkit_tasks t
    SET stream_seq = t.stream_seq + 1
    WHERE t.id = %(task_id)s
      AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s)
      AND t.stream_seq < %(max_items)s
    RETURNING t.id, t.tenant, t.stream_seq
), item AS (
    INSERT INTO toolkit_task_stream (task_id, tenant, seq, occurrence, fencing_token, value)
    SELECT id, tenant, stream_seq, %(occurrence)s, %(token)s, %(value)s FROM task
    RETURNING task_id, seq
)
SELECT seq, task_id::text AS notify_toolkit_stream FROM item;

-- name: stream_full
SELECT stream_seq >= %(max_items)s AS full FROM toolkit_tasks
WHERE id = %(task_id)s AND tenant = %(tenant)s;

-- name: report_progress
-- ctx.progress: a notification only (channel toolkit_progress, payload JSON {task, value}):
-- best effort, never stored.
SELECT pg_notify('toolkit_progress', %(payload)s) IS NULL AS notified;

-- name: stream_items
-- The items of a task's stream after %(after)s, in order, at most %(limit)s.
SELECT seq, occurrence, fencing_token, value, published_at
FROM toolkit_task_stream
WHERE task_id = %(task_id)s AND tenant = %(tenant)s AND seq > %(after)s
ORDER BY seq
LIMIT %(limit)s;
