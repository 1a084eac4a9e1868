-- name: lock_limited_tenants
-- The first statement of a claim when tenants have a max_active (docs/tenants.md): lock the
-- limited tenants of the claim's window (the %(window)s ready, unpaused tenants of lowest
-- vtime, migration 0020) that no other claimer holds. The claim that follows in the same
-- transaction (a fresh snapshot, taken after these locks) counts their leases and takes at
-- most max_active minus that; a tenant another claimer holds is skipped this round. NO KEY
-- UPDATE: claimers exclude each other, budget rows (FOR KEY SHARE of their tenant) do not.
SELECT tenant
FROM toolkit_tenants
WHERE tenant IN (SELECT tenant FROM toolkit_tenants
                 WHERE ready AND NOT paused
                 ORDER BY vtime, tenant
                 LIMIT %(window)s)
  AND max_active IS NOT NULL
ORDER BY tenant
FOR NO KEY UPDATE SKIP LOCKED;

-- fragment: due_tasks
-- The claimable tasks of tenant tn.tenant, in claim-time order (due time less a minute per
-- priority level, migration 0017), at most tn.slots of them: queued or waiting tasks whose
-- run_at has come, and leased ones whose lease expired (recoverable), of the claiming
-- worker's definitions. A leased task is due at its lease expiry, so one range of the claim
-- index finds every claimable task and never steps over live leases; the range ends at now
-- in claim time, and the due filter leaves out what a priority's credit reaches ahead
-- (tasks above priority 0 due within 9 minutes). Not locked here: the statement locks what
-- it chooses.
SELECT id, state AS previous_state, lease_owner AS previous_owner,
       lease_deferred AS previous_deferred,
       CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AS due_at,
       (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AT TIME ZONE 'UTC')
           - priority * interval '1 minute' AS claim_at
FROM toolkit_tasks
WHERE tenant = tn.tenant
  AND state IN ('queued', 'leased', 'waiting')
  AND (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AT TIME ZONE 'UTC')
      - priority * interval '1 minute'
      <= (SELECT statement_timestamp() AT TIME ZONE 'UTC')  -- a sub-select: an index bound
  AND CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
      <= (SELECT statement_timestamp())
  AND definition_digest = ANY(%(digests)s::text[])
ORDER BY (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END AT TIME ZONE 'UTC')
         - priority * interval '1 minute', id
LIMIT tn.slots

-- fragment: take_leases
-- The claim of the candidate rows (id, previous_state, previous_owner, previous_deferred,
-- due_at): each becomes leased by %(worker_id)s until database now + %(lease_seconds)s, its
-- fencing token one higher (DESIGN §2), with a claimed (or recovered, for an expired lease)
-- event carrying its queue delay; lease_deferred is %(deferring)s (the claimer has a
-- checkpoint window, migration 0027) except for a takeover, and deferred_before tells a
-- takeover whether the lease it took over was. One row per task claimed, or a single row with a NULL id when none was; each
-- carries the claim's summary (dry: the picked tenants that had nothing due for this
-- worker; window_full: the window held as many tenants as it may), whether tenants with a
-- max_active exist (limits), whether more than one tenant is unpaused (tenants: 1 or 2) and
-- whether tasks may wait for a concurrency key that has room (key_wakes), so that the
-- claimer knows what to do next.
claimed AS (
    UPDATE toolkit_tasks t
    SET state = 'leased',
        wait_reason = NULL,
        lease_owner = %(worker_id)s,
        lease_token = t.lease_token + 1,
        lease_expires_at = statement_timestamp() + %(lease_seconds)s * interval '1 second',
        attempts = t.attempts + 1,
        lease_deferred = %(deferring)s::boolean AND c.previous_state <> 'leased',
        updated_at = statement_timestamp()
    FROM candidates c
    WHERE t.id = c.id
    RETURNING t.id, t.tenant, t.definition_digest, t.input, t.checkpoint, t.lease_token,
              t.attempts, t.cancel_requested, t.tags, t.parent_id, t.map_index, t.trace_parent,
              t.trace_attempt, c.previous_state,
              c.previous_owner, c.previous_deferred,
              extract(epoch FROM statement_timestamp() - c.due_at)::float8 AS queue_delay,
              extract(epoch FROM t.deadline_at - statement_timestamp())::float8 AS deadline_in
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, detail)
    SELECT id, tenant,
           CASE WHEN previous_state = 'leased' THEN 'recovered' ELSE 'claimed' END,
           %(worker_id)s, lease_token,
           -- queue_delay: seconds from due to claimed (database time), for history
           CASE WHEN previous_state = 'leased'
                THEN jsonb_build_object('previous_owner', previous_owner,
                                        'queue_delay', round(queue_delay::numeric, 6))
                ELSE jsonb_build_object('queue_delay', round(queue_delay::numeric, 6)) END
    FROM claimed
)
SELECT c.id, c.tenant, c.definition_digest, c.input, c.checkpoint, c.lease_token, c.attempts,
       c.cancel_requested, c.tags,
       -- a child whose end wakes its parent (not a distributed map's item: DESIGN §2)
       c.parent_id IS NOT NULL AND c.map_index IS NULL AS child, c.trace_parent,
       c.trace_attempt, c.previous_state = 'leased' AS recovered,
       c.previous_state = 'leased' AND c.previous_deferred AS deferred_before, c.queue_delay,
       c.deadline_in, s.dry, s.window_full,
       EXISTS (SELECT 1 FROM toolkit_tenants WHERE max_active IS NOT NULL AND NOT paused)
           AS limits,
       (SELECT count(*) FROM (SELECT 1 FROM toolkit_tenants WHERE NOT paused LIMIT 2) two)
           AS tenants,
       EXISTS (SELECT 1 FROM toolkit_key_wakes) AS key_wakes
FROM summary s
LEFT JOIN claimed c ON true
ORDER BY c.id

-- name: claim_tasks
-- Claims up to %(limit)s due tasks of the given definitions, fairly across tenants
-- (docs/tenants.md), reading only the tenants it picks (docs/decisions.md, "The fair claim
-- at any number of tenants"). The window: the %(window)s ready, unpaused tenants of lowest
-- vtime, and those promoted by this claim (not ready, their next_due come: at most
-- %(window)s, soonest first). For each, its due tasks (due_tasks) up to the batch or to the
-- tenant's free slots; a tenant with a max_active is read only when it is in %(locked)s
-- (this transaction holds its row, see lock_limited_tenants), its free slots max_active
-- minus its unexpired leases (an expired lease holds no slot). The batch then goes to the
-- tenants of lowest vtime plus unexpired leases per unit of weight, counting the tasks of
-- this batch as they are picked (a weighted fair share of the leased slots; vtime is the
-- same for every tenant until more are ready than a window holds), ties by claim time (due
-- time less a minute per priority level); a tenant's leases are only counted when it has a
-- limit or shares the queue with other tenants. The chosen rows are locked last, in
-- that order, skipping those another claimer holds and re-checked as due.
WITH promoted AS (
    -- (an array: the planner then reads these rows by key, never joining every tenant)
    -- (an unpaused tenant rejoins the rotation at its floor: rotation_floor)
    UPDATE toolkit_tenants tn
    SET ready = true, next_due = NULL,
        vtime = CASE WHEN tn.paused THEN tn.vtime
                     ELSE greatest(tn.vtime,
                                   -- include: rotation_floor
                                   ) END
    WHERE tn.tenant = ANY(ARRAY(SELECT tenant FROM toolkit_tenants
                                WHERE NOT ready AND next_due <= (SELECT statement_timestamp())
                                ORDER BY next_due
                                LIMIT %(window)s
                                FOR NO KEY UPDATE SKIP LOCKED))
    RETURNING tn.tenant, tn.weight, tn.max_active, tn.paused, tn.vtime
), rotation AS (
    SELECT tenant, weight, max_active, vtime
    FROM toolkit_tenants
    WHERE ready AND NOT paused
    ORDER BY vtime, tenant
    LIMIT %(window)s
), tn AS (
    SELECT p.tenant, p.weight, p.vtime,
           CASE WHEN p.max_active IS NULL
                     AND (SELECT count(*) FROM (SELECT 1 FROM toolkit_tenants
                                                WHERE NOT paused LIMIT 2) two) < 2
                THEN 0
                ELSE (SELECT count(*) FROM toolkit_tasks a
                      WHERE a.state = 'leased' AND a.tenant = p.tenant
                        AND a.lease_expires_at > (SELECT statement_timestamp())) END AS active,
           p.max_active
    FROM (SELECT tenant, weight, max_active, vtime FROM rotation
          UNION ALL
          SELECT tenant, weight, max_active, vtime FROM promoted WHERE NOT paused) p
    WHERE p.max_active IS NULL OR p.tenant = ANY(%(locked)s::text[])
), due AS (
    SELECT d.*, tn.tenant, tn.weight, tn.active, tn.vtime,
           row_number() OVER (PARTITION BY tn.tenant ORDER BY d.claim_at, d.id) AS rank
    FROM (
        SELECT tn.*,
               -- least() ignores the NULL of a tenant without a limit
               greatest(least(%(limit)s::bigint, tn.max_active - tn.active), 0) AS slots
        FROM tn
    ) tn
    CROSS JOIN LATERAL (
        -- include: due_tasks
    ) d
), candidates AS (
    SELECT t.id, t.state AS previous_state, t.lease_owner AS previous_owner,
           t.lease_deferred AS previous_deferred,
           CASE WHEN t.state = 'leased' THEN t.lease_expires_at ELSE t.run_at END AS due_at
    FROM due
    JOIN toolkit_tasks t ON t.id = due.id
    -- Read by key, never a scan of the live tasks: the ids as an array, and "not ended"
    -- spelled so that the planner cannot use the claim index's predicate instead.
    WHERE t.id = ANY(ARRAY(SELECT id FROM due))
      AND t.state NOT IN ('succeeded', 'failed', 'cancelled')
      AND CASE WHEN t.state = 'leased' THEN t.lease_expires_at ELSE t.run_at END
          <= statement_timestamp()
    ORDER BY due.vtime + (due.active + due.rank - 1)::float8 / due.weight, due.claim_at, due.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), summary AS (
    SELECT ARRAY(SELECT tenant FROM tn
                 WHERE tenant NOT IN (SELECT tenant FROM due)) AS dry,
           (SELECT count(*) FROM rotation) >= %(window)s AS window_full
),
-- include: take_leases
;

-- name: claim_tasks_one_tenant
-- claim_tasks when one tenant is all there is (no other unpaused tenant, no max_active):
-- fairness has nothing to share, so the claim is one range of that tenant's claim index, as
-- in a single-tenant queue, locked as it is read. It claims nothing once another tenant is
-- registered, the tenant is paused or limited; the claimer then makes the fair claim at
-- once, and keeps to it until a claim sees one tenant alone again.
WITH candidates AS (
    SELECT due.*
    FROM (
        SELECT %(tenant)s::text AS tenant, %(limit)s::bigint AS slots
        WHERE NOT EXISTS (SELECT 1 FROM toolkit_tenants
                          WHERE tenant = %(tenant)s AND (paused OR max_active IS NOT NULL))
          AND (SELECT count(*) FROM (SELECT 1 FROM toolkit_tenants
                                     WHERE NOT paused LIMIT 2) two) = 1
    ) tn
    CROSS JOIN LATERAL (
        -- include: due_tasks
        FOR UPDATE SKIP LOCKED
    ) due
), summary AS (
    SELECT '{}'::text[] AS dry, false AS window_full
),
-- include: take_leases
;

-- name: advance_rotation
-- After a claim whose window was full: each tenant served moves on in the rotation by the
-- tasks it got per unit of weight (%(tenants)s, %(counts)s). Its own statement, after the
-- claim committed; it waits for no lock (a tenant row another statement holds is skipped,
-- and the claimer owes it to the next one). Returns the tenants moved on.
WITH locked AS (
    SELECT tenant
    FROM toolkit_tenants
    WHERE tenant = ANY(%(tenants)s::text[])
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE toolkit_tenants tn
SET vtime = tn.vtime + s.n::float8 / tn.weight
FROM unnest(%(tenants)s::text[], %(counts)s::int[]) AS s(tenant, n)
WHERE tn.tenant = s.tenant
  AND tn.tenant = ANY(ARRAY(SELECT tenant FROM locked))
RETURNING tn.tenant;

-- name: demote_dry_tenants
-- After a claim that found %(tenants)s dry: demote them (toolkit_demote_tenants, migration
-- 0020: its lock and its probe in one statement, so no client can hold the lock between).
SELECT toolkit_demote_tenants(%(tenants)s::text[]) AS demoted;

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
    SET heartbeat_at = statement_timestamp(),
        expires_at = statement_timestamp() + %(lease_seconds)s * interval '1 second'
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
    SET lease_expires_at = statement_timestamp() + %(lease_seconds)s * interval '1 second'
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
