-- name: claim_tasks
-- Claims up to %(limit)s due tasks of the given definitions: queued or waiting ones whose
-- run_at has come, and leased ones whose lease expired (recoverable). The fencing token rises by one
-- on every claim (DESIGN §2); the lease expiry is database time.
WITH candidates AS (
    SELECT id, state AS previous_state, lease_owner AS previous_owner, run_at
    FROM toolkit_tasks
    WHERE state IN ('queued', 'leased', 'waiting')
      AND run_at <= clock_timestamp()
      AND (state <> 'leased' OR lease_expires_at <= clock_timestamp())
      AND definition_digest = ANY(%(digests)s::text[])
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE toolkit_tasks t
    SET state = 'leased',
        wait_reason = NULL,
        lease_owner = %(worker_id)s,
        lease_token = t.lease_token + 1,
        lease_expires_at = clock_timestamp() + %(lease_seconds)s * interval '1 second',
        attempts = t.attempts + 1,
        updated_at = clock_timestamp()
    FROM candidates c
    WHERE t.id = c.id
    RETURNING t.id, t.tenant, t.definition_digest, t.input, t.checkpoint, t.lease_token,
              t.attempts, t.cancel_requested, c.previous_state, c.previous_owner,
              extract(epoch FROM clock_timestamp() - c.run_at)::float8 AS queue_delay
), events AS (
    INSERT INTO toolkit_task_events (task_id, kind, worker_id, fencing_token, detail)
    SELECT id,
           CASE WHEN previous_state = 'leased' THEN 'recovered' ELSE 'claimed' END,
           %(worker_id)s, lease_token,
           CASE WHEN previous_state = 'leased'
                THEN jsonb_build_object('previous_owner', previous_owner) END
    FROM claimed
)
SELECT id, tenant, definition_digest, input, checkpoint, lease_token, attempts,
       cancel_requested, previous_state = 'leased' AS recovered, queue_delay
FROM claimed
ORDER BY id;

-- name: renew_leases
-- One statement per heartbeat interval renews every lease this process holds, keyed by
-- (task, token): a lease that expired or moved to a higher token is not revived.
WITH worker AS (
    UPDATE toolkit_workers
    SET heartbeat_at = clock_timestamp(),
        expires_at = clock_timestamp() + %(lease_seconds)s * interval '1 second'
    WHERE worker_id = %(worker_id)s AND stopped_at IS NULL
)
UPDATE toolkit_tasks t
SET lease_expires_at = clock_timestamp() + %(lease_seconds)s * interval '1 second'
FROM unnest(%(task_ids)s::bigint[], %(tokens)s::bigint[]) AS held(task_id, token)
WHERE t.id = held.task_id
  AND t.lease_token = held.token
  AND t.lease_owner = %(worker_id)s
  AND t.state = 'leased'
  AND t.lease_expires_at > clock_timestamp()
RETURNING t.id, t.cancel_requested;

-- name: commit_fenced
-- The one fenced write (DESIGN §2): applied only while (task, worker, token) still holds an
-- unexpired lease, in the same statement. It stores the checkpoint, appends effect evidence
-- and events, marks consumed signals, and moves the task to its next state. run_at becomes
-- %(run_at)s when given (a timestamp; 9999-12-31 for "never"), else database now +
-- %(delay_seconds)s when given, else stays. A task with a cancel request that would go on
-- waiting or queued ends cancelled instead, so no request is lost between two heartbeats.
-- Returns the state applied; zero rows means LeaseLost.
WITH guard AS (
    UPDATE toolkit_tasks
    SET checkpoint = %(checkpoint)s,
        state = CASE WHEN cancel_requested IS NOT NULL AND %(state)s::text IN ('queued', 'waiting')
                     THEN 'cancelled' ELSE %(state)s::text END,
        wait_reason = CASE WHEN cancel_requested IS NOT NULL AND %(state)s::text IN ('queued', 'waiting')
                           THEN NULL ELSE %(wait_reason)s::text END,
        run_at = CASE
            WHEN %(run_at)s::timestamptz IS NOT NULL THEN %(run_at)s::timestamptz
            WHEN %(delay_seconds)s::float8 IS NOT NULL
                THEN clock_timestamp() + %(delay_seconds)s::float8 * interval '1 second'
            ELSE run_at END,
        lease_owner = CASE WHEN %(state)s = 'leased' THEN lease_owner END,
        lease_expires_at = CASE WHEN %(state)s = 'leased' THEN lease_expires_at END,
        result = %(result)s::jsonb,
        error = CASE WHEN cancel_requested IS NOT NULL AND %(state)s::text IN ('queued', 'waiting')
                     THEN jsonb_build_object(
                         'name', 'Cancelled',
                         'message', coalesce(cancel_requested ->> 'reason', 'cancelled by request'),
                         'step', %(checkpoint)s::jsonb ->> 'cursor')
                     ELSE %(error)s::jsonb END,
        finished_at = CASE WHEN %(state)s::text IN ('succeeded', 'failed', 'cancelled')
                             OR (cancel_requested IS NOT NULL
                                 AND %(state)s::text IN ('queued', 'waiting'))
                           THEN clock_timestamp() END,
        updated_at = clock_timestamp()
    WHERE id = %(task_id)s
      AND lease_owner = %(worker_id)s
      AND lease_token = %(token)s
      AND state = 'leased'
      AND lease_expires_at > clock_timestamp()
    RETURNING id, state
), evidence AS (
    INSERT INTO toolkit_effect_evidence
        (task_id, occurrence, step, handler, idempotent, idempotency_key, record, attempt,
         fencing_token, worker_id, result, error)
    SELECT guard.id, r.occurrence, r.step, r.handler, r.idempotent, r.idempotency_key,
           r.record, r.attempt, %(token)s, %(worker_id)s, r.result, r.error
    FROM guard,
         jsonb_to_recordset(%(records)s::jsonb) AS r(
             occurrence text, step text, handler text, idempotent boolean,
             idempotency_key text, record text, attempt integer, result jsonb, error jsonb)
), events AS (
    INSERT INTO toolkit_task_events (task_id, kind, worker_id, fencing_token, detail)
    SELECT guard.id, e.kind, %(worker_id)s, %(token)s, e.detail
    FROM guard, jsonb_to_recordset(%(events)s::jsonb) AS e(kind text, detail jsonb)
    UNION ALL
    SELECT guard.id, 'cancelled', %(worker_id)s, %(token)s,
           jsonb_build_object('reason', 'cancel request found at the end of a cycle')
    FROM guard
    WHERE guard.state = 'cancelled' AND %(state)s::text <> 'cancelled'
), consumed AS (
    UPDATE toolkit_signals s
    SET consumed_at = clock_timestamp(), consumed_by = c.occurrence, consumed_token = %(token)s
    FROM guard, jsonb_to_recordset(%(signals)s::jsonb) AS c(id bigint, occurrence text)
    WHERE s.id = c.id AND s.task_id = guard.id AND s.consumed_at IS NULL
)
SELECT id, state FROM guard;

-- name: next_signal
-- The oldest signal of this name not consumed yet, nor taken by this cycle (%(taken)s ids:
-- its consumption is written with the cycle's next fenced write).
SELECT id, payload
FROM toolkit_signals
WHERE task_id = %(task_id)s AND name = %(name)s AND consumed_at IS NULL
  AND NOT (id = ANY(%(taken)s::bigint[]))
ORDER BY id
LIMIT 1;

-- name: wake_if_signalled
-- Run right after a task starts waiting for a signal: a signal that arrived while the task
-- was still leased makes it due at once (the sender only wakes tasks already waiting).
UPDATE toolkit_tasks
SET run_at = clock_timestamp()
WHERE id = %(task_id)s
  AND state = 'waiting'
  AND wait_reason = 'signal'
  AND EXISTS (SELECT 1 FROM toolkit_signals
              WHERE task_id = %(task_id)s AND name = %(name)s AND consumed_at IS NULL)
RETURNING id, pg_notify('toolkit_wakeup', '') IS NULL AS notified;
