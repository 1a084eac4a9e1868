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
           - priority * interval '1 minute' AS claim_at,
       extract(epoch FROM statement_timestamp()
                          - CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
       )::float8 AS queue_delay
FROM toolkit_tasks
WHERE tenant = tn.tenant
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)  -- (a constant: Citus routes by it)
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
-- queue_delay: seconds from due to now): each becomes leased by %(worker_id)s until database
-- now + %(lease_seconds)s, its fencing token one higher (DESIGN §2); lease_deferred is
-- %(deferring)s (the claimer has a checkpoint window, migration 0027) except for a
-- takeover, and deferred_before tells a takeover whether the lease it took over was. CTE
-- claimed; the including statement selects from it (claim_result on one PostgreSQL) and
-- records its events (claim_events, or record_event on a distributed store). Nothing here
-- reads the clock in RETURNING, which Citus refuses.
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
    WHERE t.id = c.id AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
      -- (by key: a generic plan, not knowing the claim's count, expects a tenth of the due
      -- tasks and would hash a scan of every task to join them)
      AND t.id = ANY(ARRAY(SELECT id FROM candidates))
    RETURNING t.id, t.tenant, t.definition_digest, t.input, t.checkpoint, t.lease_token,
              t.attempts, t.cancel_requested, t.tags, t.parent_id, t.map_index, t.trace_parent,
              t.trace_attempt, c.previous_state,
              c.previous_owner, c.previous_deferred, c.queue_delay, t.deadline_at
)

-- fragment: claim_events
-- The claimed (or recovered) event of each task in CTE claimed (id, tenant, lease_token,
-- and claim_event_values' columns).
events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, detail)
    SELECT id, tenant, event_kind, %(worker_id)s, lease_token, event_detail
    FROM (
        SELECT id, tenant, lease_token,
        -- include: claim_event_values
        FROM claimed
    ) c
)

-- fragment: claim_event_values
-- The kind and detail of a claimed task's event (columns of CTE claimed: previous_state,
-- previous_owner, queue_delay): claimed, or recovered for an expired lease, carrying its
-- queue delay (seconds from due to claimed, database time) and, for a takeover, the
-- previous owner.
CASE WHEN previous_state = 'leased' THEN 'recovered' ELSE 'claimed' END AS event_kind,
jsonb_strip_nulls(jsonb_build_object(
    'previous_owner', CASE WHEN previous_state = 'leased' THEN previous_owner END,
    'queue_delay', round(queue_delay::numeric, 6))) AS event_detail

-- fragment: claimed_columns
-- The columns of a claimed task (CTE claimed as c) that a claim returns (ClaimedTask).
c.id, c.tenant, c.definition_digest, c.input, c.checkpoint, c.lease_token, c.attempts,
c.cancel_requested, c.tags,
-- a child whose end wakes its parent (not a distributed map's item: DESIGN §2)
c.parent_id IS NOT NULL AND c.map_index IS NULL AS child, c.trace_parent,
c.trace_attempt, c.previous_state = 'leased' AS recovered,
c.previous_state = 'leased' AND c.previous_deferred AS deferred_before, c.queue_delay,
extract(epoch FROM c.deadline_at - statement_timestamp())::float8 AS deadline_in

-- fragment: claim_result
-- The rows of a claim on one PostgreSQL (take_leases): one per task claimed, or one with a
-- NULL id, each with the claim's summary and what the claimer is to do next.
SELECT
-- include: claimed_columns
       , s.dry, s.window_full,
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
-- %(window)s, soonest first). For each, its due tasks (due_tasks) up to %(per_tenant)s (the
-- batch, at most rotation.FAIR_READ: the reads stay those of that batch) or its share of the
-- batch if more (fewer tenants than the batch needs at that), or to the tenant's free
-- slots; a tenant with a max_active is read only when it is in %(locked)s
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
               -- least() ignores the NULL of a tenant without a limit; with fewer tenants
               -- than the batch needs at %(per_tenant)s each, each is read for its share
               greatest(least(
                   %(limit)s::bigint,
                   greatest(%(per_tenant)s::bigint,
                            ceil(%(limit)s::float8 / (SELECT count(*) FROM tn))::bigint),
                   tn.max_active - tn.active), 0) AS slots
        FROM tn
    ) tn
    CROSS JOIN LATERAL (
        -- include: due_tasks
    ) d
), best AS (
    -- The ids of the due tasks in the order the batch takes them, four batches at most: the
    -- rows past those serve only when more than three claims running at once hold the rows
    -- before them (such a claim then takes fewer, and the next one the rest).
    SELECT ARRAY(
        SELECT id FROM due
        ORDER BY vtime + (active + rank - 1)::float8 / weight, claim_at, id
        LIMIT 4 * %(limit)s
    ) AS ids
), candidates AS (
    SELECT t.id, t.state AS previous_state, t.lease_owner AS previous_owner,
           t.lease_deferred AS previous_deferred,
           extract(epoch FROM statement_timestamp()
                              - CASE WHEN t.state = 'leased' THEN t.lease_expires_at
                                     ELSE t.run_at END)::float8 AS queue_delay
    FROM toolkit_tasks t
    -- Read by key, never a scan of the live tasks: the ids as an array, and "not ended"
    -- spelled so that the planner cannot use the claim index's predicate instead. Not
    -- joined with the CTE: planned for a handful of rows, such a join compared every row
    -- with every other (512 with 512, 13 ms of a 15 ms claim over 32 busy tenants); each
    -- row's place in the array orders them instead (docs/decisions.md, "The fair claim's
    -- candidates, cut before they are locked").
    WHERE t.id = ANY((SELECT ids FROM best)::bigint[])
      AND t.state NOT IN ('succeeded', 'failed', 'cancelled')
      AND CASE WHEN t.state = 'leased' THEN t.lease_expires_at ELSE t.run_at END
          <= statement_timestamp()
    ORDER BY array_position((SELECT ids FROM best), t.id)
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), summary AS (
    SELECT ARRAY(SELECT tenant FROM tn
                 WHERE tenant NOT IN (SELECT tenant FROM due)) AS dry,
           (SELECT count(*) FROM rotation) >= %(window)s AS window_full
),
-- include: take_leases
,
-- include: claim_events
-- include: claim_result
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
,
-- include: claim_events
-- include: claim_result
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
-- holds (lease_renewals). The registration renews only while it is this process's
-- (%(incarnation)s): once another process took the worker id over, registered is false. (Its
-- leases cannot outlive it: they expire at the same moment, renewed by this same statement,
-- and the id is taken over only once the registration expired.) Returns one row per lease
-- renewed or ended by this process's own write (ended), or one row with a NULL id when
-- there is none. (On a store distributed by tenant: renew_registration, then
-- renew_tenant_leases per tenant.)
WITH
-- include: worker_renewal
,
-- include: lease_renewals
SELECT EXISTS (SELECT 1 FROM worker) AS registered, r.id, r.cancel_requested, r.ended
-- include: renewal_rows
;

-- name: renew_registration
-- renew_leases' registration alone (a store distributed by tenant: the workers' table is a
-- reference table, renewed by a statement of its own, after the leases', so that it expires
-- no sooner than they do). Returns whether it renewed.
WITH
-- include: worker_renewal
SELECT EXISTS (SELECT 1 FROM worker) AS registered;

-- name: renew_tenant_leases
-- renew_leases' leases of tenant %(tenant)s alone (every lease in the arrays is of that
-- tenant), routed to its shard: a store distributed by tenant renews each tenant's leases by a
-- statement of its own, before renew_registration. Rows as renew_leases' (registered true).
WITH
-- include: lease_renewals
SELECT true AS registered, r.id, r.cancel_requested, r.ended
-- include: renewal_rows
;

-- fragment: worker_renewal
-- The worker's registration renewed while it is this process's (CTE worker: its id, or none).
worker AS (
    UPDATE toolkit_workers
    SET heartbeat_at = statement_timestamp(),
        expires_at = statement_timestamp() + %(lease_seconds)s * interval '1 second'
    WHERE worker_id = %(worker_id)s AND incarnation = %(incarnation)s AND stopped_at IS NULL
    RETURNING worker_id
)

-- fragment: lease_renewals
-- Every lease in (%(task_ids)s, %(tenants)s, %(tokens)s) renewed, each fenced by (worker,
-- tenant, task, token): a lease that expired or moved to a higher token is not revived.
-- Rows are locked in id order, as the group commit does, so the two never deadlock.
-- %(tenant)s: the one tenant of them all, or null (any). CTEs renewed (id,
-- cancel_requested) and released: the leases this process's own last write ended (the
-- task's token is still the lease's, and it is no longer leased: nobody claimed it since),
-- their cycles ending, not lost. Both are read from the rows as locked, re-checked on
-- their latest version: a write that committed while this statement waited for its row
-- (a group commit's transaction, on a distributed store several statements) is seen.
held AS (
    SELECT t.id, t.state = 'leased' AS leased
    FROM toolkit_tasks t
    JOIN unnest(%(task_ids)s::bigint[], %(tenants)s::text[], %(tokens)s::bigint[])
         AS h(task_id, tenant, token)
      ON t.id = h.task_id
    WHERE (toolkit_lease_held(t, %(worker_id)s, h.tenant, h.token)
           OR (t.lease_token = h.token AND t.tenant = h.tenant AND t.state <> 'leased'))
      AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
    ORDER BY t.id
    FOR NO KEY UPDATE OF t
), renewed AS (
    UPDATE toolkit_tasks t
    SET lease_expires_at = statement_timestamp() + %(lease_seconds)s * interval '1 second'
    FROM held
    -- held locked the rows whose lease is held, re-checked on their latest version: none
    -- can change until this statement commits (and the fence in an UPDATE's own WHERE
    -- keeps Citus from routing the statement to one shard)
    WHERE t.id = held.id AND held.leased
      AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
    RETURNING t.id, t.cancel_requested
), released AS (
    SELECT id FROM held WHERE NOT leased
)

-- fragment: renewal_rows
-- The rows of a renewal: one per lease renewed (ended false) or released (ended true), or
-- one with a NULL id when there is none.
FROM (SELECT 1) AS one
LEFT JOIN (
    SELECT id, cancel_requested, false AS ended FROM renewed
    UNION ALL
    SELECT id, NULL, true FROM released
) r ON true

-- name: claim_window
-- The claim on a store distributed by tenant (docs/scaling.md), first of its statements: the
-- tenants it serves, read without a lock (Citus locks rows of one shard per statement). The
-- ready, unpaused tenants of lowest vtime (promoted false), then up to %(window)s tenants
-- out of the rotation whose next_due has come (promoted true: the claimer promotes each by
-- promote_tenant before claiming its tasks); each row carries whether tasks may wait for a
-- concurrency key that has room (key_wakes) and whether more tenants are ready than a
-- window holds (window_full); one row with a null tenant when there is none to serve.
WITH rotation AS (
    SELECT tenant, weight, max_active, vtime, false AS promoted
    FROM toolkit_tenants
    WHERE ready AND NOT paused
    ORDER BY vtime, tenant
    LIMIT %(window)s
), due AS (
    SELECT tenant, weight, max_active, vtime, true AS promoted
    FROM toolkit_tenants
    WHERE NOT ready AND next_due <= (SELECT statement_timestamp())
    ORDER BY next_due
    LIMIT %(window)s
), flags AS (
    SELECT EXISTS (SELECT 1 FROM toolkit_key_wakes) AS key_wakes,
           (SELECT count(*) FROM rotation) >= %(window)s AS window_full
)
SELECT r.tenant, r.weight, r.max_active, r.vtime, r.promoted, f.key_wakes, f.window_full
FROM flags f
LEFT JOIN (SELECT * FROM rotation UNION ALL SELECT * FROM due) r ON true
ORDER BY r.promoted, r.vtime, r.tenant;

-- name: promote_tenant
-- A tenant out of the rotation whose next_due has come (claim_window) made ready, at
-- %(floor)s when unpaused (the window's lowest vtime: rotation_floor, read by claim_window;
-- null: it keeps its own). Routed to the tenant's shard. Returns the tenant when this
-- statement promoted it and it is unpaused (a claim then serves it).
UPDATE toolkit_tenants tn
SET ready = true, next_due = NULL,
    vtime = CASE WHEN tn.paused THEN tn.vtime
                 ELSE greatest(tn.vtime, %(floor)s::float8) END
WHERE tn.tenant = %(tenant)s AND NOT tn.ready
  AND tn.next_due <= (SELECT statement_timestamp())
RETURNING tn.tenant, NOT tn.paused AS serve;

-- name: lock_limited_tenant
-- lock_limited_tenants for one tenant, routed to its shard: the tenant's row when it has a
-- max_active and no other claimer holds it; the claim_tenant_tasks that follows in the same
-- transaction counts its leases in a snapshot taken after the lock.
SELECT tenant
FROM toolkit_tenants
WHERE tenant = %(tenant)s AND max_active IS NOT NULL
FOR NO KEY UPDATE SKIP LOCKED;

-- name: claim_tenant_tasks
-- The claim of up to %(limit)s due tasks of tenant %(tenant)s (due_tasks, locked as they are
-- read, then take_leases), one statement routed to the tenant's shard: the claim on a store
-- distributed by tenant makes one per tenant it serves (Leases.claim; docs/scaling.md). A
-- paused tenant gets nothing; one with a max_active only when %(locked)s (this transaction
-- holds its row: lock_limited_tenant), and at most max_active minus its unexpired leases.
-- Returns one row per task claimed (claimed_columns, previous_owner, and its event's
-- claim_event_values); the events are the transaction's next statements (record_event).
WITH tn AS (
    SELECT tn.tenant,
           CASE WHEN tn.max_active IS NULL THEN %(limit)s::bigint
                ELSE greatest(least(%(limit)s::bigint, tn.max_active - (
                    SELECT count(*) FROM toolkit_tasks a
                    WHERE a.tenant = %(tenant)s AND a.state = 'leased'
                      AND a.lease_expires_at > (SELECT statement_timestamp()))), 0) END AS slots
    FROM toolkit_tenants tn
    WHERE tn.tenant = %(tenant)s AND NOT tn.paused
      AND (tn.max_active IS NULL OR %(locked)s::boolean)
), candidates AS (
    SELECT due.*
    FROM tn
    CROSS JOIN LATERAL (
        -- include: due_tasks
        FOR UPDATE SKIP LOCKED
    ) due
),
-- include: take_leases
SELECT
-- include: claimed_columns
       , c.previous_owner,
-- include: claim_event_values
FROM claimed c
ORDER BY c.id;

-- name: advance_tenant
-- advance_rotation for one tenant, routed to its shard: it moves on by %(count)s tasks per
-- unit of weight unless another statement holds its row. Returns the tenant when moved on.
WITH locked AS (
    SELECT tenant FROM toolkit_tenants WHERE tenant = %(tenant)s FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE toolkit_tenants tn
SET vtime = tn.vtime + %(count)s::float8 / tn.weight
FROM locked
WHERE tn.tenant = %(tenant)s AND locked.tenant = tn.tenant
RETURNING tn.tenant;
