-- name: lock_limited_tenants
-- The first statement of a claim when tenants have a max_active (docs/tenants.md): lock
-- every such tenant that no other claimer holds. The claim that follows in the same
-- transaction (a fresh snapshot, taken after these locks) counts their leases and takes at
-- most max_active minus that; a tenant another claimer holds is skipped this round. NO KEY
-- UPDATE: claimers exclude each other, budget rows (FOR KEY SHARE of their tenant) do not.
SELECT tenant
FROM toolkit_tenants
WHERE max_active IS NOT NULL AND NOT paused
ORDER BY tenant
FOR NO KEY UPDATE SKIP LOCKED;

-- fragment: due_tasks
-- The claimable tasks of tenant tn.tenant, in claim-time order (due time less a minute per
-- priority level, migration 0017), at most tn.slots of them, locked with SKIP LOCKED: queued
-- or waiting tasks whose run_at has come, and leased ones whose lease expired (recoverable),
-- of the claiming worker's definitions. A leased task is due at its lease expiry, so one
-- range of the claim index finds every claimable task and never steps over live leases; the
-- range ends at now in claim time, and the due filter leaves out what a priority's credit
-- reaches ahead (tasks above priority 0 due within 9 minutes).
SELECT id, state AS previous_state, lease_owner AS previous_owner,
       CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AS due_at,
       (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AT TIME ZONE 'UTC')
           - priority * interval '1 minute' AS claim_at
FROM toolkit_tasks
WHERE tenant = tn.tenant
  AND state IN ('queued', 'leased', 'waiting')
  AND (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AT TIME ZONE 'UTC')
      - priority * interval '1 minute'
      <= (SELECT clock_timestamp() AT TIME ZONE 'UTC')  -- a sub-select: an index bound
  AND CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
      <= (SELECT clock_timestamp())
  AND definition_digest = ANY(%(digests)s::text[])
ORDER BY (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AT TIME ZONE 'UTC')
         - priority * interval '1 minute', id
LIMIT tn.slots
FOR UPDATE SKIP LOCKED

-- fragment: take_leases
-- The claim of the candidate rows (id, previous_state, previous_owner, due_at): each becomes
-- leased by %(worker_id)s until database now + %(lease_seconds)s, its fencing token one
-- higher (DESIGN §2), with a claimed (or recovered, for an expired lease) event carrying its
-- queue delay. Every row tells whether tenants with a max_active exist (limits), how many
-- tenants are unpaused and whether tasks may wait for a concurrency key that has room
-- (key_wakes), so that the claimer knows which claim to make next.
claimed AS (
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
              t.attempts, t.cancel_requested, t.tags, t.parent_id, t.trace_parent,
              t.trace_attempt, c.previous_state,
              c.previous_owner,
              extract(epoch FROM clock_timestamp() - c.due_at)::float8 AS queue_delay,
              extract(epoch FROM t.deadline_at - clock_timestamp())::float8 AS deadline_in
), events AS (
    INSERT INTO toolkit_task_events (task_id, kind, worker_id, fencing_token, detail)
    SELECT id,
           CASE WHEN previous_state = 'leased' THEN 'recovered' ELSE 'claimed' END,
           %(worker_id)s, lease_token,
           -- queue_delay: seconds from due to claimed (database time), for history
           CASE WHEN previous_state = 'leased'
                THEN jsonb_build_object('previous_owner', previous_owner,
                                        'queue_delay', round(queue_delay::numeric, 6))
                ELSE jsonb_build_object('queue_delay', round(queue_delay::numeric, 6)) END
    FROM claimed
)
SELECT id, tenant, definition_digest, input, checkpoint, lease_token, attempts,
       cancel_requested, tags, parent_id IS NOT NULL AS child, trace_parent, trace_attempt,
       previous_state = 'leased' AS recovered, queue_delay, deadline_in,
       EXISTS (SELECT 1 FROM toolkit_tenants WHERE max_active IS NOT NULL AND NOT paused)
           AS limits,
       (SELECT count(*) FROM toolkit_tenants WHERE NOT paused) AS tenants,
       EXISTS (SELECT 1 FROM toolkit_key_wakes) AS key_wakes
FROM claimed
ORDER BY id

-- name: claim_tasks
-- Claims up to %(limit)s due tasks of the given definitions, fairly across tenants
-- (docs/tenants.md). For each tenant that is not paused, its due tasks (due_tasks) up to the
-- batch or to the tenant's free slots. A tenant with a max_active is read only when it is in
-- %(locked)s (this transaction holds its row, see lock_limited_tenants); its free slots are
-- max_active minus its unexpired leases (an expired lease holds no slot). The batch then
-- goes to the tenants with the fewest unexpired leases per unit of weight, counting the
-- tasks of this batch as they are picked (a weighted fair share of the leased slots), ties by
-- claim time (due time less a minute per priority level); a tenant's leases are only counted
-- when it has a limit or shares the queue with other tenants.
WITH candidates AS (
    SELECT c.*
    FROM (
        SELECT tn.*,
               -- least() ignores the NULL of a tenant without a limit
               greatest(least(%(limit)s::bigint, tn.max_active - tn.active), 0) AS slots
        FROM (
            SELECT tn.tenant, tn.weight, tn.max_active,
                   CASE WHEN tn.max_active IS NULL
                             AND (SELECT count(*) < 2 FROM toolkit_tenants WHERE NOT paused)
                        THEN 0
                        ELSE (SELECT count(*) FROM toolkit_tasks a
                              WHERE a.state = 'leased' AND a.tenant = tn.tenant
                                AND a.lease_expires_at > (SELECT clock_timestamp())) END
                       AS active
            FROM toolkit_tenants tn
            WHERE NOT tn.paused
              AND (tn.max_active IS NULL OR tn.tenant = ANY(%(locked)s::text[]))
        ) tn
    ) tn
    CROSS JOIN LATERAL (
        SELECT due.*, tn.weight, tn.active,
               row_number() OVER (ORDER BY due.claim_at, due.id) AS rank
        FROM (
            -- include: due_tasks
        ) due
    ) c
    ORDER BY (c.active + c.rank - 1)::float8 / c.weight, c.claim_at, c.id
    LIMIT %(limit)s
),
-- include: take_leases
;

-- name: claim_tasks_one_tenant
-- claim_tasks when one tenant is all there is (no other unpaused tenant, no max_active):
-- fairness has nothing to share, so the claim is one range of that tenant's claim index, as
-- in a single-tenant queue. It claims nothing once another tenant is registered, the tenant
-- is paused or limited; the claimer then makes the fair claim at once, and keeps to it until
-- a claim sees one tenant alone again.
WITH candidates AS (
    SELECT due.*
    FROM (
        SELECT %(tenant)s::text AS tenant, %(limit)s::bigint AS slots
        WHERE NOT EXISTS (SELECT 1 FROM toolkit_tenants
                          WHERE tenant = %(tenant)s AND (paused OR max_active IS NOT NULL))
          AND (SELECT count(*) FROM toolkit_tenants WHERE NOT paused) = 1
    ) tn
    CROSS JOIN LATERAL (
        -- include: due_tasks
    ) due
),
-- include: take_leases
;

-- name: renew_leases
-- One statement per heartbeat interval renews this process's registration and every lease it
-- holds, each fenced by (worker, tenant, task, token): a lease that expired or moved to a
-- higher token is not revived. The registration renews only while it is this process's
-- (%(incarnation)s): once another process took the worker id over, registered is false. (Its
-- leases cannot outlive it: they expire at the same moment, renewed by this same statement,
-- and the id is taken over only once the registration expired.) Rows are locked in id
-- order, as the group commit does, so the two never deadlock. Returns one row per lease
-- renewed or ended by this process's own write (ended), or one row with a NULL id when
-- there is none.
WITH worker AS (
    UPDATE toolkit_workers
    SET heartbeat_at = clock_timestamp(),
        expires_at = clock_timestamp() + %(lease_seconds)s * interval '1 second'
    WHERE worker_id = %(worker_id)s AND incarnation = %(incarnation)s AND stopped_at IS NULL
    RETURNING worker_id
), held AS (
    SELECT t.id, h.tenant, h.token
    FROM toolkit_tasks t
    JOIN unnest(%(task_ids)s::bigint[], %(tenants)s::text[], %(tokens)s::bigint[])
         AS h(task_id, tenant, token)
      ON t.id = h.task_id
    WHERE toolkit_lease_held(t, %(worker_id)s, h.tenant, h.token)
    ORDER BY t.id
    FOR NO KEY UPDATE OF t
), renewed AS (
    UPDATE toolkit_tasks t
    SET lease_expires_at = clock_timestamp() + %(lease_seconds)s * interval '1 second'
    FROM held
    WHERE t.id = held.id
      AND toolkit_lease_held(t, %(worker_id)s, held.tenant, held.token)
    RETURNING t.id, t.cancel_requested
), released AS (
    -- Leases this process's own last write ended (the task's token is still the lease's,
    -- and it is no longer leased: nobody claimed it since), committed while this statement
    -- waited: their cycles are ending, not lost.
    SELECT t.id
    FROM toolkit_tasks t
    JOIN unnest(%(task_ids)s::bigint[], %(tokens)s::bigint[]) AS h(task_id, token)
      ON t.id = h.task_id
    WHERE t.lease_token = h.token AND t.state <> 'leased'
)
SELECT EXISTS (SELECT 1 FROM worker) AS registered, r.id, r.cancel_requested, r.ended
FROM (SELECT 1) AS one
LEFT JOIN (
    SELECT id, cancel_requested, false AS ended FROM renewed
    UNION ALL
    SELECT id, NULL, true FROM released
) r ON true;
