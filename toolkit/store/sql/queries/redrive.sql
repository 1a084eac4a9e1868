-- name: task_children
-- Every child task of %(task_id)s, by the parent occurrence that started it (a redrive
-- redrives a failed one, or says which a re-planned step replaces).
SELECT id, parent_occurrence, state, definition_name, error ->> 'name' AS error_name
FROM toolkit_tasks
WHERE parent_id = %(task_id)s AND tenant = %(tenant)s
ORDER BY id;

-- name: redrive_clock
-- Whether the task's workflow deadline has passed (database time).
SELECT deadline_at IS NOT NULL AND deadline_at <= statement_timestamp() AS deadline_passed
FROM toolkit_tasks
WHERE id = %(task_id)s AND tenant = %(tenant)s;

-- name: redrive_task
-- A redrive (issue 19, docs/reliability.md): applied only while the task is still in
-- %(state)s under fencing token %(token)s (compare-and-set: no row means it changed since
-- the plan was made). In one statement: the checkpoint it resumes from; queued at once;
-- its result, error and cancel request cleared; its fencing token bumped, as a claim bumps
-- it, so that a stale worker's late commit is refused; its definition digest and version
-- moved when redriven onto another version; a new workflow deadline %(timeout)s seconds
-- from now when given; the rows of its parallel or map step in progress rewritten
-- (%(branches)s of step occurrence %(fanout)s) or dropped (%(dropped)s, with the rows of
-- the steps nested in their branches); a redriven event
-- under the new token, by %(operator)s, with the reason and the plan (%(detail)s). A task
-- with a concurrency key waits for it again: parked (waiting, reason concurrency, due never
-- but at its workflow deadline) with a wake row, for the admission to take. The rotation's
-- marks: due_marks.
WITH
-- include: due_in_statement
,
-- include: keys_in_statement
, target AS (
    SELECT id FROM toolkit_tasks
    WHERE id = %(task_id)s AND tenant = %(tenant)s AND state = %(state)s
      AND lease_token = %(token)s
    FOR NO KEY UPDATE
), updated AS (
    UPDATE toolkit_tasks t
    SET state = CASE WHEN t.concurrency_key IS NULL THEN 'queued' ELSE 'waiting' END,
        wait_reason = CASE WHEN t.concurrency_key IS NOT NULL THEN 'concurrency' END,
        run_at = CASE WHEN t.concurrency_key IS NULL THEN (SELECT statement_timestamp())
                      ELSE least('9999-12-31T00:00:00+00:00'::timestamptz,
                                 CASE WHEN %(timeout)s::float8 IS NULL THEN t.deadline_at
                                      ELSE (SELECT statement_timestamp()
                                            + make_interval(secs => %(timeout)s::float8))
                                 END) END,
        key_held = false, start_after = NULL,
        checkpoint = %(checkpoint)s::jsonb, lease_token = t.lease_token + 1,
        lease_owner = NULL, lease_expires_at = NULL, result = NULL, error = NULL,
        cancel_requested = NULL, finished_at = NULL, child_wake = false,
        definition_digest = %(digest)s, definition_version = %(version)s,
        deadline_at = CASE WHEN %(timeout)s::float8 IS NULL THEN t.deadline_at
                           ELSE (SELECT statement_timestamp()
                                         + make_interval(secs => %(timeout)s::float8))
                      END,
        updated_at = statement_timestamp()
    FROM target, due_in_statement, keys_in_statement
    WHERE t.id = target.id AND t.tenant = %(tenant)s
    RETURNING t.id, t.tenant, t.lease_token, t.run_at, t.definition_name, t.concurrency_key
), key_parked AS (
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    SELECT tenant, definition_name, concurrency_key FROM updated
    WHERE concurrency_key IS NOT NULL
), made_due AS (
    SELECT tenant, run_at AS at FROM updated
),
-- include: due_marks
, rewritten AS (
    UPDATE toolkit_branches b
    SET status = r.status, frame = r.frame, run_at = NULL, waits_for = '{}', wakes = 0,
        seen = 0
    FROM updated u
    CROSS JOIN jsonb_to_recordset(%(branches)s::jsonb) AS r(name text, status text, frame jsonb)
    WHERE b.task_id = u.id AND b.tenant = %(tenant)s AND b.fanout = %(fanout)s
      AND b.name = r.name
), dropped AS (
    DELETE FROM toolkit_branches b
    USING updated u
    WHERE b.task_id = u.id AND b.tenant = %(tenant)s
      AND EXISTS (SELECT 1 FROM unnest(%(dropped)s::text[]) AS d(fanout)
                  WHERE b.fanout = d.fanout OR starts_with(b.fanout, d.fanout || '/'))
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, detail)
    SELECT id, tenant, 'redriven', %(operator)s, lease_token, %(detail)s::jsonb
    FROM updated
)
SELECT id, lease_token, ''::text AS notify_toolkit_wakeup FROM updated;
