-- name: commit_fenced
-- The fenced write (DESIGN §2), for a batch of tasks at once (group commit). Each write in
-- %(writes)s is applied only while (its task, %(worker_id)s, its token) still holds an
-- unexpired lease, in this same statement: it stores the checkpoint, appends effect
-- evidence and events, marks consumed signals, and moves the task to its next state.
-- run_at becomes the write's run_at when given (a timestamp; 9999-12-31 for "never"), else
-- database now + delay_seconds when given, else stays. A task with a cancel request that would go on waiting or queued ends cancelled
-- instead, so no request is lost between two heartbeats. Rows are locked in id order.
-- A write with a write_id is stored with it (checkpoint ->> 'write'); sent again after its
-- outcome was lost with a connection, it is found applied and applied again never. (A signal
-- or callback wait whose signal or completion is stored is made due by wake_raced_waits.)
-- A wait for a child (reason child) is due at once when a child ended while the task held
-- its lease (child_wake) or ends in this same statement. A task that ends wakes its parent
-- (a different row: a parent written by this statement is not touched twice), unless it
-- is an item of a distributed map (map_index: its parent counts them). A write's
-- budget_delta ({resource: amount}) is added to its tenant's budget use, and its
-- budget_released (reservations returned) taken off the reserved part of it. run_at is never
-- later than the task's workflow deadline (deadline_at), unless the write clears it.
-- Completed or failed evidence releases the downstream-limit slots of its occurrence and
-- wakes a task waiting for each (docs/limits.md).
-- A write without a checkpoint keeps the stored one, its cursor cleared. A write's tags
-- (set by handlers with ctx.tag) are added to the task's; its trace_attempt (the first write
-- of a traced cycle) replaces the task's.
-- A write's branches replace the stored rows of those branches of parallel or map steps
-- (toolkit_branches: one row per branch, so a branch's end writes that branch alone), and
-- its branches_ended (step occurrences that ended) delete theirs and those of the steps
-- nested in their branches (occurrences under 'STEP#N/'). (A child that ends wakes
-- a waiting branch of its parent that waits for it: wake_branches, in the same
-- transaction, after this statement locked the parent's row.)
-- A task that ends does here what task_ended says (endings.sql: its concurrency key, a
-- scheduled run's outcome, an awaited task's announcement); the reservations it still
-- holds are returned by budget_use. The rotation's marks (due_marks): a task whose write
-- makes it due before its lease would have expired, a woken parent, a task woken by a
-- released limit slot.
-- Returns a row per write applied (id, applied state; fenced_write_rest says the rest), a
-- missing id meaning LeaseLost, and the notifications to send (notify_toolkit_wakeup,
-- notify_toolkit_task_ended).
-- include: fenced_write
-- include: task_ended
,
-- include: fenced_write_inserts
,
-- include: fenced_write_rest
;

-- name: commit_step
-- commit_fenced for a batch of lean writes (each with lean true; the caller checks them:
-- Leases.commit_many). A lean write keeps its task's lease (state leased: a step's outcome
-- within a cycle) or ends the task, and carries nothing that fenced_write_rest acts on: no
-- branches ended, no signals consumed, no budget change, no evidence that releases
-- downstream-limit slots. A lean write that ends a task whose end does more than its own row
-- (a key holder, an awaited task, a scheduled run, a child whose parent waits, a task that
-- still holds reservations: task_ended, woken_parents, budget_use) is referred back (CTE
-- locked), and with it the whole batch, unapplied: the caller sends the batch again by
-- commit_fenced, so that it still commits whole or not at all. For the writes it applies,
-- every CTE of those fragments and task_ended selects nothing (they act on
-- tasks that wait or are queued, on what a write carries, on slots its evidence releases,
-- or on such ends), so this statement leaves them out: 9 CTEs and init plans where
-- commit_fenced has 34, each started and run by the server whether it selects anything or
-- not. Same fencing, replay check, checkpoint, evidence, branch rows and events. Returns a
-- row per write applied or found applied before (id, state, referred false), a missing id
-- meaning LeaseLost, and one per write referred back (id, null, referred true): with one,
-- nothing of the batch was applied.
-- include: fenced_write
-- include: fenced_write_inserts
SELECT id, state, false AS referred FROM guard
UNION ALL
SELECT id, state, false FROM replayed
UNION ALL
SELECT id, NULL, true FROM locked WHERE referred
;

-- name: commit_fenced_on_shard
-- commit_fenced for one tenant's writes on a store distributed by tenant (docs/scaling.md):
-- the same statement but a scheduled run's outcome (task_ended_on_shard), so that it is
-- routed to the tenant's shard whole; the caller counts the outcomes of the scheduled runs
-- it ended (count_schedule_outcomes, same transaction) and passes %(tenant)s and
-- %(wake_within)s.
-- include: fenced_write
-- include: task_ended_on_shard
,
-- include: fenced_write_rest
;

-- name: record_event
-- One event of a task, %(kind)s with %(detail)s, under fencing token %(token)s: on a store
-- distributed by tenant, the events of the tasks a claim took (claim_tenant_tasks' event
-- columns) and of the writes commit_fenced_on_shard applied, each in their transaction.
-- What commit_fenced inserts in CTEs (fenced_write_inserts, claim_events) is there a
-- statement per row, sent together (executemany): Citus routes an INSERT of values to the
-- tenant's shard, and the transaction commits in one phase; an INSERT ... SELECT it runs on
-- the coordinator, copies to the shard, and commits in two (docs/scaling.md). So do
-- record_evidence, record_branch, record_cancel_found and record_key_wake.
INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, detail)
VALUES (%(task_id)s, %(tenant)s, %(kind)s, %(worker_id)s, %(token)s, %(detail)s);

-- name: record_evidence
-- One effect evidence record of a write commit_fenced_on_shard applied (record_event says
-- why a statement per row): fenced_write_inserts' evidence.
INSERT INTO toolkit_effect_evidence
    (task_id, tenant, occurrence, step, handler, idempotent, idempotency_key, record,
     attempt, fencing_token, worker_id, result, error, spend)
VALUES (%(task_id)s, %(tenant)s, %(occurrence)s, %(step)s, %(handler)s, %(idempotent)s,
        %(idempotency_key)s, %(record)s, %(attempt)s, %(token)s, %(worker_id)s, %(result)s,
        %(error)s, %(spend)s);

-- name: record_branch
-- One branch row of a write commit_fenced_on_shard applied, replacing the stored one
-- (record_event says why a statement per row): fenced_write_inserts' branch_rows.
INSERT INTO toolkit_branches AS b
    (task_id, tenant, fanout, name, position, status, frame, run_at, waits_for, seen)
VALUES (%(task_id)s, %(tenant)s, %(fanout)s, %(name)s, %(position)s, %(status)s, %(frame)s,
        %(run_at)s::timestamptz, %(waits_for)s::text[], %(seen)s)
-- include: branch_row_update
;

-- name: record_cancel_found
-- The cancelled event of a write commit_fenced_on_shard found a cancel request for (its
-- row's cancelling), under fencing token %(token)s (record_event says why a statement per
-- row): fenced_write_inserts' last event.
INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, detail)
VALUES (%(task_id)s, %(tenant)s, 'cancelled', %(worker_id)s, %(token)s,
-- include: cancel_found_detail
);

-- name: record_key_wake
-- The wake row of a concurrency key an ended holder released, for a write
-- commit_fenced_on_shard applied (its row's released_key; record_event says why a
-- statement per row): task_ended's key_released.
INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
VALUES (%(tenant)s, %(definition_name)s, %(concurrency_key)s);

-- fragment: branch_row_update
-- A branch row written again replaces the stored one (fenced_write_inserts, record_branch).
ON CONFLICT (task_id, fanout, name, tenant) DO UPDATE
SET position = excluded.position, status = excluded.status, frame = excluded.frame,
    run_at = excluded.run_at, waits_for = excluded.waits_for, seen = excluded.seen

-- fragment: cancel_found_detail
-- The detail of the cancelled event of a task whose write found a cancel request.
jsonb_build_object('reason', 'cancel request found at the end of a cycle')

-- fragment: fenced_write
-- commit_fenced up to its tasks' ends (CTE ended), which the including statement follows
-- with task_ended (or task_ended_on_shard), then fenced_write_rest.
WITH w AS (
    -- (values that read the clock or build JSON are made here and in locked, not in the
    -- UPDATE's CASE: Citus refuses a function that is not immutable there, issue 25)
    SELECT *,
           state IN ('queued', 'waiting') AS may_cancel,
           statement_timestamp() AS now_at,
           statement_timestamp() + delay_seconds * interval '1 second' AS delayed_at,
           jsonb_strip_nulls(jsonb_build_object('write', write_id)) AS write_mark
    FROM jsonb_to_recordset(%(writes)s::jsonb) AS w(
        task_id bigint, tenant text, token bigint, checkpoint jsonb, state text, wait_reason text,
        run_at timestamptz, delay_seconds float8, result jsonb, error jsonb,
        evidence jsonb, events jsonb, signals jsonb, write_id text, budget_delta jsonb,
        budget_released jsonb, clear_deadline boolean, tags jsonb, branches jsonb,
        branches_ended jsonb, trace_attempt text, lean boolean)
),
-- include: ends_in_statement
,
-- include: due_in_statement
, replayed AS (
    -- each write's own row, by its key (LIMIT keeps the lookup per write: joined whole,
    -- the planner would scan every task for a batch it expects a hundred writes in)
    SELECT t.id, t.state
    FROM w
    CROSS JOIN LATERAL (
        SELECT t.id, t.state
        FROM toolkit_tasks t
        WHERE t.id = w.task_id AND t.lease_token = w.token
          AND t.checkpoint ->> 'write' = w.write_id
          AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
        LIMIT 1
    ) t
    WHERE w.write_id IS NOT NULL
), locked AS (
    SELECT t.id, t.cancel_requested IS NOT NULL AND w.may_cancel AS cancelling,
           t.lease_expires_at AS lease_due,
           jsonb_build_object(
               'name', 'Cancelled',
               'message', coalesce(t.cancel_requested ->> 'reason', 'cancelled by request'),
               'step', w.checkpoint ->> 'cursor') AS cancel_error,
           -- a lean write (commit_step's) that ends a task whose end does more than its own
           -- row (task_ended, budget_use, woken_parents; the triggers of migration 0029) is
           -- referred back to the caller with its batch, unapplied: read off the row as
           -- locked, its latest version, so a task awaited since the snapshot is referred
           coalesce(w.lean, false) AND w.state IN ('succeeded', 'failed', 'cancelled')
           AND (t.key_held OR t.awaited OR t.schedule_name IS NOT NULL
                OR (t.parent_id IS NOT NULL AND t.map_index IS NULL)
                OR coalesce(jsonb_typeof(coalesce(w.checkpoint, t.checkpoint)
                                         #> '{fanout,reserved}') = 'object', false)
           ) AS referred
    FROM toolkit_tasks t
    JOIN w ON t.id = w.task_id
    -- (by key: joined with the batch alone, which the planner expects a hundred writes in,
    -- the generic plan read every live lease of the fleet and kept the writer's)
    WHERE t.id = ANY(ARRAY(SELECT task_id FROM w))
      AND toolkit_lease_held(t, %(worker_id)s, w.tenant, w.token)
      AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
      AND t.id NOT IN (SELECT id FROM replayed)
    ORDER BY t.id
    FOR NO KEY UPDATE OF t
), ending_children AS (
    SELECT c.parent_id
    FROM toolkit_tasks c
    JOIN w ON c.id = w.task_id
    WHERE c.parent_id IS NOT NULL AND c.map_index IS NULL
      AND w.state IN ('succeeded', 'failed', 'cancelled')
      AND (%(tenant)s::text IS NULL OR c.tenant = %(tenant)s)
), guard AS (
    UPDATE toolkit_tasks t
    SET checkpoint = coalesce(w.checkpoint, t.checkpoint || '{"cursor": null}') || w.write_mark,
        state = CASE WHEN l.cancelling THEN 'cancelled' ELSE w.state END,
        wait_reason = CASE WHEN l.cancelling THEN NULL ELSE w.wait_reason END,
        deadline_at = CASE WHEN w.clear_deadline THEN NULL ELSE t.deadline_at END,
        trace_attempt = coalesce(w.trace_attempt, t.trace_attempt),
        run_at = LEAST(CASE
            WHEN NOT l.cancelling AND w.state = 'waiting' AND w.wait_reason IN ('child', 'branches')
                 AND (t.child_wake OR t.id IN (SELECT parent_id FROM ending_children))
                THEN w.now_at
            WHEN w.run_at IS NOT NULL THEN w.run_at
            WHEN w.delay_seconds IS NOT NULL THEN w.delayed_at
            ELSE t.run_at END,
            -- a task waits no longer than its workflow deadline
            CASE WHEN w.clear_deadline THEN NULL ELSE t.deadline_at END),
        lease_owner = CASE WHEN w.state = 'leased' THEN t.lease_owner END,
        lease_expires_at = CASE WHEN w.state = 'leased' THEN t.lease_expires_at END,
        result = w.result,
        error = CASE WHEN l.cancelling THEN l.cancel_error ELSE w.error END,
        finished_at = CASE WHEN l.cancelling OR w.state IN ('succeeded', 'failed', 'cancelled')
                           THEN w.now_at END,
        child_wake = false,
        -- tags a handler set (ctx.tag); unchanged otherwise, so the update stays HOT
        tags = CASE WHEN w.tags IS NULL THEN t.tags ELSE t.tags || w.tags END,
        updated_at = statement_timestamp()
    FROM w, locked l, ends_in_statement, due_in_statement
    WHERE t.id = w.task_id AND l.id = w.task_id
      -- (commit_step applies its batch whole, or none of it when it refers an end back)
      AND NOT EXISTS (SELECT 1 FROM locked WHERE referred)
      AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
    RETURNING t.id, t.state, w.token, l.cancelling, t.tenant, t.parent_id, t.map_index,
              t.run_at, l.lease_due,
              t.definition_name, t.concurrency_key, t.key_held, t.schedule_name, t.awaited,
              CASE WHEN t.state IN ('succeeded', 'failed', 'cancelled')
                   THEN t.checkpoint -> 'fanout' END AS fanout
), ended AS (
    SELECT * FROM guard WHERE state IN ('succeeded', 'failed', 'cancelled')
),

-- fragment: fenced_write_inserts
-- commit_fenced's rows inserted for each write applied (CTE guard: id, tenant, token,
-- cancelling; CTE w: the writes): its effect evidence, its branches' rows (replacing the
-- stored ones), its events (and a cancelled event for a cancel request found).
evidence AS (
    INSERT INTO toolkit_effect_evidence
        (task_id, tenant, occurrence, step, handler, idempotent, idempotency_key, record,
         attempt, fencing_token, worker_id, result, error, spend)
    SELECT g.id, g.tenant, r.occurrence, r.step, r.handler, r.idempotent, r.idempotency_key,
           r.record, r.attempt, g.token, %(worker_id)s, r.result, r.error, r.spend
    FROM guard g
    JOIN w ON w.task_id = g.id
    CROSS JOIN LATERAL jsonb_to_recordset(w.evidence) AS r(
        occurrence text, step text, handler text, idempotent boolean,
        idempotency_key text, record text, attempt integer, result jsonb, error jsonb,
        spend jsonb)
), branch_rows AS (
    INSERT INTO toolkit_branches AS b
        (task_id, tenant, fanout, name, position, status, frame, run_at, waits_for, seen)
    SELECT g.id, g.tenant, r.fanout, r.name, r.position, r.status, r.frame, r.run_at,
           ARRAY(SELECT jsonb_array_elements_text(r.waits_for)), r.seen
    FROM guard g
    JOIN w ON w.task_id = g.id
    CROSS JOIN LATERAL jsonb_to_recordset(w.branches) AS r(
        fanout text, name text, position integer, status text, frame jsonb,
        run_at timestamptz, waits_for jsonb, seen integer)
    -- include: branch_row_update
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, detail)
    SELECT g.id, g.tenant, e.kind, %(worker_id)s, g.token, e.detail
    FROM guard g
    JOIN w ON w.task_id = g.id
    CROSS JOIN LATERAL jsonb_to_recordset(w.events) AS e(kind text, detail jsonb)
    UNION ALL
    SELECT g.id, g.tenant, 'cancelled', %(worker_id)s, g.token,
           -- include: cancel_found_detail
    FROM guard g
    WHERE g.cancelling
)

-- fragment: fenced_write_rest
-- commit_fenced after its tasks' ends and inserts: budgets, parents, branches ended,
-- signals, limit slots, the rotation's marks and the returned rows: each write applied (id,
-- state) with what a statement that does not insert needs to do the rest (cancelling;
-- schedule_name of a run that ended; the definition and key a holder released).
budget_use AS (
    UPDATE toolkit_tenant_budgets b
    -- A released reservation leaves used by what the row really held of it (none when the
    -- budget was set after the reservation was taken): its spend counts either way. Then a
    -- task that ends while its checkpoint still records reservations (failed or cancelled
    -- mid-step) returns what the row holds of them, its spend counting (returned, spent).
    SET used = b.used + d.delta + (d.released - least(d.released, b.reserved))
               - least(d.returned, b.reserved - least(d.released, b.reserved)) + d.spent,
        reserved = b.reserved - least(d.released, b.reserved)
                   - least(d.returned, b.reserved - least(d.released, b.reserved))
    FROM (
        SELECT g.tenant, k.resource, sum(k.delta) AS delta, sum(k.released) AS released,
               sum(k.returned) AS returned, sum(k.spent) AS spent
        FROM guard g
        JOIN w ON w.task_id = g.id
        CROSS JOIN LATERAL (
            SELECT key AS resource, value::numeric AS delta, 0::numeric AS released,
                   0::numeric AS returned, 0::numeric AS spent
            FROM jsonb_each_text(w.budget_delta)
            UNION ALL
            SELECT key, 0, value::numeric, 0, 0 FROM jsonb_each_text(w.budget_released)
            UNION ALL
            SELECT key, 0, 0, value::numeric,
                   coalesce((g.fanout #>> ARRAY['spent', key])::numeric, 0)
            FROM jsonb_each_text(CASE WHEN jsonb_typeof(g.fanout -> 'reserved') = 'object'
                                      THEN g.fanout -> 'reserved' END)
        ) k
        GROUP BY g.tenant, k.resource
        ORDER BY g.tenant, k.resource
    ) d
    WHERE b.tenant = d.tenant AND b.resource = d.resource
      AND (%(tenant)s::text IS NULL OR b.tenant = %(tenant)s)
), woken_parents AS (
    UPDATE toolkit_tasks p
    SET child_wake = true,
        run_at = CASE WHEN p.state = 'waiting' AND p.wait_reason IN ('child', 'branches')
                      THEN w.now_at ELSE p.run_at END
    FROM guard g
    JOIN w ON w.task_id = g.id
    WHERE p.id = g.parent_id AND g.map_index IS NULL
      AND g.state IN ('succeeded', 'failed', 'cancelled')
      AND p.state IN ('leased', 'waiting')
      AND p.id NOT IN (SELECT task_id FROM w)
      AND p.tenant = g.tenant AND (%(tenant)s::text IS NULL OR p.tenant = %(tenant)s)
    RETURNING p.id, p.tenant, p.state, p.run_at
), branches_dropped AS (
    DELETE FROM toolkit_branches b
    USING guard g
    JOIN w ON w.task_id = g.id
    CROSS JOIN LATERAL jsonb_array_elements_text(w.branches_ended) AS e(fanout)
    WHERE b.task_id = g.id AND b.tenant = g.tenant
      AND (%(tenant)s::text IS NULL OR b.tenant = %(tenant)s)
      AND (b.fanout = e.fanout OR starts_with(b.fanout, e.fanout || '/'))
), consumed AS (
    UPDATE toolkit_signals s
    SET consumed_at = statement_timestamp(), consumed_by = c.occurrence, consumed_token = g.token
    FROM guard g
    JOIN w ON w.task_id = g.id
    CROSS JOIN LATERAL jsonb_to_recordset(w.signals) AS c(id bigint, occurrence text)
    WHERE s.id = c.id AND s.task_id = g.id AND s.consumed_at IS NULL
      AND s.tenant = g.tenant AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s)
), released_slots AS (
    -- Downstream limits (docs/limits.md): the completed or failed evidence of an occurrence
    -- releases the slots it took, atomically with the evidence (one primary-key probe per
    -- outcome record; nothing when the write carries none).
    DELETE FROM toolkit_limit_slots s
    USING guard g
    JOIN w ON w.task_id = g.id
    CROSS JOIN LATERAL jsonb_to_recordset(w.evidence) AS r(occurrence text, record text)
    WHERE r.record IN ('completed', 'failed')
      AND s.task_id = g.id AND s.occurrence = r.occurrence
      AND s.tenant = g.tenant AND (%(tenant)s::text IS NULL OR s.tenant = %(tenant)s)
    RETURNING s.name, s.scope
), limit_waiters AS MATERIALIZED (
    -- Each released slot makes the first task waiting for its limit and scope due now: of
    -- any tenant, or of %(wake_within)s alone (a store distributed by tenant routes the
    -- statement to one shard: limits_unwoken tells the caller what is left to wake). Chosen
    -- once, here: read again for each row an UPDATE joined them with (a plan may do that),
    -- the waiter just updated was skipped and the next one taken too.
    SELECT x.id, r.name, r.scope
    FROM (SELECT name, scope, count(*) AS n FROM released_slots GROUP BY name, scope) r
    CROSS JOIN LATERAL (
        SELECT x.id
        FROM toolkit_tasks x
        WHERE x.state = 'waiting' AND x.wait_reason = 'limit'
          AND x.wait_limit = r.name
          AND x.checkpoint -> 'wait' ->> 'scope' = r.scope
          AND x.run_at > statement_timestamp()
          AND (%(wake_within)s::text IS NULL OR x.tenant = %(wake_within)s)
        ORDER BY x.run_at
        LIMIT r.n
        FOR NO KEY UPDATE SKIP LOCKED
    ) x
), limit_woken AS (
    UPDATE toolkit_tasks t
    SET run_at = statement_timestamp()
    FROM limit_waiters x
    WHERE t.id = x.id AND t.id = ANY(ARRAY(SELECT id FROM limit_waiters))
      AND (%(wake_within)s::text IS NULL OR t.tenant = %(wake_within)s)
    RETURNING t.id, t.tenant, t.run_at, x.name, x.scope
), limits_unwoken AS (
    -- With %(wake_within)s set: the global limits whose released slots found fewer waiters
    -- of this tenant to wake, and how many more each may wake. After the commit, the caller
    -- wakes the next waiters of the other tenants (next_limit_waiters).
    SELECT r.name, r.n - count(w.id) AS n
    FROM (SELECT name, count(*) AS n FROM released_slots WHERE scope = '' GROUP BY name) r
    LEFT JOIN limit_woken w ON w.name = r.name AND w.scope = ''
    WHERE %(wake_within)s::text IS NOT NULL
    GROUP BY r.name, r.n
    HAVING r.n > count(w.id)
), made_due AS (
    SELECT tenant, run_at AS at FROM guard
    WHERE state IN ('queued', 'waiting') AND run_at < lease_due
    UNION ALL
    SELECT tenant, run_at FROM woken_parents WHERE state = 'waiting'
    UNION ALL
    SELECT tenant, run_at FROM limit_woken
),
-- include: due_marks
, notices AS (
    -- idle workers are woken (after the statement, on its connection) when a parent, a
    -- task waiting for a limit or one waiting for a released key was made due; the ends of
    -- awaited tasks are announced
    SELECT CASE WHEN EXISTS (SELECT 1 FROM woken_parents) OR EXISTS (SELECT 1 FROM limit_woken)
                     OR EXISTS (SELECT 1 FROM ended_wakeup)
                THEN '' END AS wakeup,
           (SELECT ids FROM ended_awaited) AS ended
)
SELECT id, state, cancelling,
       CASE WHEN state IN ('succeeded', 'failed') THEN schedule_name END AS schedule_name,
       CASE WHEN key_held AND state IN ('succeeded', 'failed', 'cancelled')
            THEN definition_name END AS released_definition,
       CASE WHEN key_held AND state IN ('succeeded', 'failed', 'cancelled')
            THEN concurrency_key END AS released_key,
       (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended,
       (SELECT jsonb_object_agg(name, n) FROM limits_unwoken) AS limits_unwoken
FROM guard
UNION ALL
SELECT id, state, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM replayed

-- name: next_signal
-- The oldest signal of these names not consumed yet, nor taken by this cycle (%(taken)s ids:
-- its consumption is written with the cycle's next fenced write), addressed to the task as
-- a whole or, for a wait inside a branch, to that branch (%(address)s; null at the task's
-- own level). A branch takes the signals addressed to it first, so that a task-wide one
-- never leaves a branch's own signal for nobody.
SELECT id, name, payload
FROM toolkit_signals
WHERE task_id = %(task_id)s AND tenant = %(tenant)s AND name = ANY(%(names)s::text[])
  AND consumed_at IS NULL
  AND NOT (id = ANY(%(taken)s::bigint[]))
  AND (address IS NULL OR address = %(address)s)
ORDER BY address IS NULL, id
LIMIT 1;

-- name: wake_raced_waits
-- The second statement of a group commit whose batch has signal or callback waits, in the
-- same transaction (%(task_ids)s: the tasks whose write applied such a wait). A signal or a
-- callback completion committed while the commit queued for the task's row lock is not in
-- commit_fenced's snapshot, and its sender saw the task leased; this statement's snapshot,
-- taken after the row locks were granted, has it. It makes such a wait due at once, in the
-- transaction that commits the wait, so no crash or outage between the two can lose it.
-- The rotation's marks: due_marks.
WITH
-- include: due_in_statement
, woken AS (
    UPDATE toolkit_tasks t
    SET run_at = statement_timestamp()
    FROM due_in_statement
    WHERE t.id = ANY(%(task_ids)s::bigint[]) AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
      AND t.state = 'waiting'
      AND t.run_at > statement_timestamp()
      -- (ORs, not CASE t.wait_reason WHEN: Citus sends that to a shard as text = boolean)
      AND ((t.wait_reason = 'signal' AND EXISTS (
              SELECT 1 FROM toolkit_signals s
              WHERE s.task_id = t.id AND s.tenant = t.tenant AND s.consumed_at IS NULL
                AND s.address IS NULL
                AND (s.name = t.checkpoint -> 'wait' ->> 'signal'
                     OR coalesce(t.checkpoint -> 'wait' -> 'signals' ? s.name, false))))
           OR (t.wait_reason = 'callback' AND EXISTS (
              SELECT 1 FROM toolkit_callbacks c
              WHERE c.token = t.checkpoint -> 'wait' ->> 'callback' AND c.tenant = t.tenant
                AND c.state = 'completed')))
    RETURNING t.id, t.tenant, t.run_at
), made_due AS (
    SELECT tenant, run_at AS at FROM woken
),
-- include: due_marks
SELECT id, ''::text AS notify_toolkit_wakeup FROM woken;

-- name: wake_waiting_branches
-- The second statement of a group commit whose batch parks branches or makes tasks wait
-- for their branches (reason branches), in the same transaction (%(task_ids)s: the tasks
-- whose write applied; %(parked)s: [{task_id, fanout, name}] of the branches their writes
-- stored waiting). A parked branch whose signal, callback completion or child's end was
-- stored before (its sender found no waiting row) gets a wake (wakes + 1): the first
-- statement locked the task's row, which every sender locks too, so this snapshot has
-- what was sent. Each task waiting for its branches then has as run_at the earliest timer
-- of its waiting branches, or now when one of them has a wake not handled yet
-- (branch_waiters_due). On a store distributed by tenant, the same in four statements
-- routed to the tenant's shard: wake_parked_on_signal, _on_callback and _on_child, then
-- make_branch_waiters_due (Citus routes no statement with an OR of sub-selects of two
-- tables: it runs one CTE by CTE on every shard, and commits it on every node by two-phase
-- commit).
WITH
-- include: parked_branches
, ready AS (
    -- include: parked_branch_wake
      AND ((
          -- include: parked_on_signal
          ) OR (
          -- include: parked_on_callback
          ) OR (
          -- include: parked_on_child
          ))
    RETURNING b.task_id
),
-- include: branch_waiters_due

-- name: wake_parked_on_signal
-- wake_waiting_branches' wake of the parked branches whose signal was stored, on a store
-- distributed by tenant (%(tenant)s; the next two statements wake those whose callback was
-- completed or child ended, make_branch_waiters_due follows).
WITH
-- include: parked_branches
-- include: parked_branch_wake
  AND
  -- include: parked_on_signal
;

-- name: wake_parked_on_callback
-- wake_parked_on_signal's sequel: the parked branches whose callback was completed.
WITH
-- include: parked_branches
-- include: parked_branch_wake
  AND
  -- include: parked_on_callback
;

-- name: wake_parked_on_child
-- wake_parked_on_callback's sequel: the parked branches whose child ended.
WITH
-- include: parked_branches
-- include: parked_branch_wake
  AND
  -- include: parked_on_child
;

-- name: make_branch_waiters_due
-- The last of wake_waiting_branches' statements on a store distributed by tenant: the
-- wakes the three before it gave are in this statement's snapshot (wakes > seen).
WITH ready AS (
    SELECT NULL::bigint AS task_id WHERE false
),
-- include: branch_waiters_due

-- fragment: parked_branches
-- The CTE of the branches a group commit's writes parked (%(parked)s of %(task_ids)s).
parked AS (
    SELECT p.task_id, p.fanout, p.name
    FROM jsonb_to_recordset(%(parked)s::jsonb) AS p(task_id bigint, fanout text, name text)
    WHERE p.task_id = ANY(%(task_ids)s::bigint[])
)

-- fragment: parked_branch_wake
-- A wake (wakes + 1) for each parked branch still waiting with no wake pending, when the
-- condition that follows holds (what it waits for was stored).
UPDATE toolkit_branches b
SET wakes = b.wakes + 1
FROM parked p
WHERE b.task_id = p.task_id AND (%(tenant)s::text IS NULL OR b.tenant = %(tenant)s)
  AND b.fanout = p.fanout AND b.name = p.name
  AND b.status = 'waiting' AND b.wakes <= b.seen

-- fragment: parked_on_signal
-- Branch b waits for a signal that is stored, not consumed, addressed to it or to the task.
EXISTS (
    SELECT 1 FROM toolkit_signals s
    WHERE s.task_id = b.task_id AND s.tenant = b.tenant AND s.consumed_at IS NULL
      AND (s.address IS NULL
           OR s.address = regexp_replace(b.fanout || '/' || b.name, '[^/]*#[0-9]+/', '', 'g'))
      AND 'signal:' || s.name = ANY(b.waits_for))

-- fragment: parked_on_callback
-- Branch b waits for a callback that was completed.
EXISTS (
    SELECT 1 FROM toolkit_callbacks c
    WHERE c.state = 'completed' AND c.tenant = b.tenant
      AND c.token IN (SELECT substr(k, 10) FROM unnest(b.waits_for) AS k
                      WHERE k LIKE 'callback:%%'))

-- fragment: parked_on_child
-- Branch b waits for a child task that ended.
EXISTS (
    SELECT 1 FROM toolkit_tasks c
    WHERE c.state IN ('succeeded', 'failed', 'cancelled') AND c.tenant = b.tenant
      AND c.id IN (SELECT substr(k, 7)::bigint FROM unnest(b.waits_for) AS k
                   WHERE k LIKE 'child:%%'))

-- fragment: branch_waiters_due
-- The tail of wake_waiting_branches and make_branch_waiters_due: each task of %(task_ids)s
-- waiting for its branches gets as run_at the earliest timer of its waiting branches, or
-- now when one of them has a wake not handled yet (CTE ready: the wakes this statement
-- gave). The rotation's marks (due_marks) count each such task as made due sooner. (The
-- clock is read outside any CASE, picked by an array subscript: element 1 when the
-- condition holds, none when not. Citus refuses a function that is not immutable inside a
-- CASE of a modifying statement, and a correlated sub-select without FROM.)
-- include: due_in_statement
, due AS (
    UPDATE toolkit_tasks t
    SET run_at = LEAST(t.run_at, w.first_timer, (ARRAY[statement_timestamp()])[
            (w.woken OR t.id IN (SELECT task_id FROM ready))::int])
    FROM due_in_statement, (
        -- the waiting branches of each task, joined rather than read by sub-selects in SET
        -- (Citus routes no statement with those)
        SELECT b.task_id, min(b.run_at) AS first_timer, bool_or(b.wakes > b.seen) AS woken
        FROM toolkit_branches b
        WHERE b.task_id = ANY(%(task_ids)s::bigint[])
          AND (%(tenant)s::text IS NULL OR b.tenant = %(tenant)s) AND b.status = 'waiting'
        GROUP BY b.task_id
    ) w
    WHERE t.id = w.task_id AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
      AND t.state = 'waiting' AND t.wait_reason = 'branches'
    RETURNING t.id, t.tenant, t.run_at
), made_due AS (
    SELECT tenant, run_at AS at FROM due
),
-- include: due_marks
SELECT id, (ARRAY[''::text])[(run_at <= statement_timestamp())::int] AS notify_toolkit_wakeup
FROM due;

-- name: database_now
-- The database's clock (time is always the database's, DESIGN §2).
SELECT statement_timestamp() AS now;

-- name: server_started
-- When the database server started: a lease that lapsed across a restart of the server is
-- the outage's, not its task's (docs/reliability.md, lapsed leases).
SELECT pg_postmaster_start_time() AS started;
