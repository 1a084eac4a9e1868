-- fragment: start_at
-- A new task's state, wait reason and run_at: queued now, or for a delayed start (%(run_at)s,
-- or database now + %(delay)s seconds) waiting, reason start, until then.
CASE WHEN %(run_at)s::timestamptz IS NULL AND %(delay)s::float8 IS NULL
     THEN 'queued' ELSE 'waiting' END AS state,
CASE WHEN %(run_at)s::timestamptz IS NULL AND %(delay)s::float8 IS NULL THEN NULL
     ELSE 'start' END AS wait_reason,
coalesce(%(run_at)s::timestamptz,
         statement_timestamp() + coalesce(%(delay)s::float8, 0) * interval '1 second') AS run_at

-- name: submit_tasks
-- Inserts one task per input and wakes idle workers (payload: nothing but ids). The tenant
-- is registered before (register_tenant). Each task with a concurrency key (null: none) is
-- admitted or parked (key_admission: lock_keys ran first, in the same transaction). The
-- rotation's marks: due_marks.
WITH
-- include: due_in_statement
,
-- include: keys_in_statement
, r AS (
    SELECT i.n, i.input, g.tags, k.key ->> 0 AS concurrency_key,
           statement_timestamp() + %(timeout)s::float8 * interval '1 second' AS deadline_at,
           -- include: start_at
    FROM jsonb_array_elements(%(inputs)s::jsonb) WITH ORDINALITY AS i(input, n)
    JOIN jsonb_array_elements(%(tags)s::jsonb) WITH ORDINALITY AS g(tags, n) ON g.n = i.n
    JOIN jsonb_array_elements(%(concurrency_keys)s::jsonb) WITH ORDINALITY AS k(key, n)
        ON k.n = i.n
), key_rows AS (
    SELECT n, %(tenant)s::text AS tenant, %(name)s::text AS definition_name, concurrency_key,
           %(concurrency_limit)s::int AS concurrency_limit
    FROM r WHERE concurrency_key IS NOT NULL
),
-- include: key_admission
, submitted AS (
    INSERT INTO toolkit_tasks
        (tenant, definition_name, definition_version, definition_digest, input, checkpoint,
         deadline_at, tags, priority, trace_parent, concurrency_key, concurrency_limit,
         key_held, start_after, state, wait_reason, run_at)
    SELECT %(tenant)s, %(name)s, %(version)s, %(digest)s, r.input, %(checkpoint)s,
           r.deadline_at, r.tags, %(priority)s, %(trace_parent)s, r.concurrency_key,
           CASE WHEN r.concurrency_key IS NOT NULL THEN %(concurrency_limit)s::int END,
           -- include: keyed_start
    FROM r
    LEFT JOIN key_decided d ON d.n = r.n
    CROSS JOIN due_in_statement
    CROSS JOIN keys_in_statement
    ORDER BY r.n
    RETURNING id, tenant, run_at, definition_name, concurrency_key, wait_reason
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind)
    SELECT id, %(tenant)s, 'submitted' FROM submitted
), key_parked AS (
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    SELECT tenant, definition_name, concurrency_key FROM submitted
    WHERE wait_reason = 'concurrency'
), made_due AS (
    SELECT tenant, run_at AS at FROM submitted
),
-- include: due_marks

SELECT id, ''::text AS notify_toolkit_wakeup
FROM submitted
ORDER BY id;

-- name: submit_keyed_task
-- Inserts one task unless (tenant, idempotency key) exists; returns the new or existing row.
-- The tenant is registered before, the task admitted or parked and the rotation's marks
-- made, as for submit_tasks.
WITH
-- include: due_in_statement
,
-- include: keys_in_statement
, r AS (
    SELECT 1 AS n,
           statement_timestamp() + %(timeout)s::float8 * interval '1 second' AS deadline_at,
           -- include: start_at
), key_rows AS (
    SELECT 1 AS n, %(tenant)s::text AS tenant, %(name)s::text AS definition_name,
           %(concurrency_key)s::text AS concurrency_key,
           %(concurrency_limit)s::int AS concurrency_limit
    WHERE %(concurrency_key)s::text IS NOT NULL
),
-- include: key_admission
, submitted AS (
    INSERT INTO toolkit_tasks
        (tenant, definition_name, definition_version, definition_digest, input, checkpoint,
         idempotency_key, deadline_at, tags, priority, trace_parent, concurrency_key,
         concurrency_limit, key_held, start_after, state, wait_reason, run_at)
    SELECT %(tenant)s, %(name)s, %(version)s, %(digest)s, %(input)s, %(checkpoint)s, %(key)s,
           r.deadline_at, %(tags)s, %(priority)s, %(trace_parent)s,
           %(concurrency_key)s, %(concurrency_limit)s,
           -- include: keyed_start
    FROM r
    LEFT JOIN key_decided d ON d.n = r.n
    CROSS JOIN due_in_statement
    CROSS JOIN keys_in_statement
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, tenant, run_at, definition_name, definition_version, definition_digest,
              concurrency_key, wait_reason
), key_parked AS (
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    SELECT tenant, definition_name, concurrency_key FROM submitted
    WHERE wait_reason = 'concurrency'
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
    SELECT id, %(tenant)s, 'submitted', jsonb_build_object('idempotency_key', %(key)s::text)
    FROM submitted
), made_due AS (
    SELECT tenant, run_at AS at FROM submitted
),
-- include: due_marks

SELECT id, definition_name, definition_version, definition_digest, true AS created,
       ''::text AS notify_toolkit_wakeup
FROM submitted
UNION ALL
SELECT id, definition_name, definition_version, definition_digest, false, NULL
FROM toolkit_tasks
WHERE tenant = %(tenant)s AND idempotency_key = %(key)s
  AND NOT EXISTS (SELECT 1 FROM submitted);

-- fragment: task_columns
SELECT t.id, t.tenant, t.definition_name, t.definition_version, t.definition_digest, t.input,
       t.state, t.wait_reason, t.run_at, t.checkpoint, t.lease_owner, t.lease_token,
       t.lease_expires_at, t.attempts, t.result, t.error, t.cancel_requested,
       t.idempotency_key, t.tags, t.schedule_name, t.scheduled_at, t.created_at,
       t.updated_at, t.finished_at, t.concurrency_key,
       t.key_held AND t.state IN ('queued', 'leased', 'waiting') AS key_held, t.priority,
       t.stream_seq, t.parent_id, t.parent_occurrence, t.map_index, t.deadline_at

-- fragment: task_filter
-- The TaskFilter (toolkit/store/filters.py): each term holds when its parameter is null.
-- Run unprepared (Database.fetch_all(prepare=False)), so each call is planned with its own
-- values and the terms not given fold away: a tag filter uses toolkit_tasks_tags, a state
-- and definition filter toolkit_tasks_definition.
    (%(states)s::text[] IS NULL OR t.state = ANY(%(states)s::text[]))
AND (%(wait_reason)s::text IS NULL OR t.wait_reason = %(wait_reason)s::text)
AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s::text)
AND (%(name)s::text IS NULL OR t.definition_name = %(name)s::text)
AND (%(version)s::int IS NULL OR t.definition_version = %(version)s::int)
AND (%(tags)s::jsonb IS NULL OR t.tags @> %(tags)s::jsonb)
AND (%(error)s::text IS NULL OR t.error ->> 'name' = %(error)s::text)
AND (%(step)s::text IS NULL
     OR coalesce(t.checkpoint ->> 'cursor', t.error ->> 'step') = %(step)s::text)
AND (%(schedule)s::text IS NULL OR t.schedule_name = %(schedule)s::text)
AND (%(parent)s::bigint IS NULL OR t.parent_id = %(parent)s::bigint)
AND (%(created_since)s::timestamptz IS NULL OR t.created_at >= %(created_since)s::timestamptz)
AND (%(created_until)s::timestamptz IS NULL OR t.created_at < %(created_until)s::timestamptz)
AND (%(finished_since)s::timestamptz IS NULL
     OR t.finished_at >= %(finished_since)s::timestamptz)
AND (%(finished_until)s::timestamptz IS NULL
     OR t.finished_at < %(finished_until)s::timestamptz)

-- name: task_tenant
-- The tenant of task %(task_id)s, for the statements that name it beside the id
-- (toolkit/store/task_tenants.py): the one per-task statement without it.
SELECT tenant FROM toolkit_tasks WHERE id = %(task_id)s;

-- name: get_task
-- include: task_columns
FROM toolkit_tasks t
WHERE t.id = %(task_id)s AND t.tenant = %(tenant)s;

-- name: list_tasks
-- One page of the tasks a filter matches, newest first: those with ids below %(before)s
-- (keyset pagination: the next page starts below the last id of this one).
-- include: task_columns
FROM toolkit_tasks t
WHERE (%(before)s::bigint IS NULL OR t.id < %(before)s::bigint)
  AND
-- include: task_filter
ORDER BY t.id DESC
LIMIT %(limit)s;

-- name: await_task
-- Marks a task awaited (its ending then notifies toolkit_task_ended, migration 0009) and
-- returns it as that update left it: an ending that committed first is seen here, one that
-- commits later sees the mark and notifies.
UPDATE toolkit_tasks SET awaited = true
WHERE id = %(task_id)s AND tenant = %(tenant)s
RETURNING id, state, wait_reason, result, error;

-- name: count_tasks
SELECT count(*) AS n
FROM toolkit_tasks t
WHERE
-- include: task_filter
;

-- name: count_matching_by_state
-- How many tasks a filter matches, by state and definition (a bulk preview's table).
SELECT t.state, t.definition_name, t.definition_version, count(*) AS n
FROM toolkit_tasks t
WHERE
-- include: task_filter
GROUP BY t.state, t.definition_name, t.definition_version
ORDER BY t.state, t.definition_name, t.definition_version;

-- name: count_tasks_by_state
SELECT state, count(*) AS n
FROM toolkit_tasks
GROUP BY state
ORDER BY state;

-- name: task_evidence
SELECT id, occurrence, step, handler, idempotent, idempotency_key, record, attempt,
       fencing_token, worker_id, result, error, spend, recorded_at
FROM toolkit_effect_evidence
WHERE task_id = %(task_id)s AND tenant = %(tenant)s
ORDER BY id;

-- name: task_events
SELECT id, kind, worker_id, fencing_token, detail, at
FROM toolkit_task_events
WHERE task_id = %(task_id)s AND tenant = %(tenant)s
ORDER BY id;

-- name: count_evidence
SELECT record, count(*) AS n
FROM toolkit_effect_evidence
GROUP BY record;

-- name: idle_state
-- Read by an idle worker after an empty claim. pending: a task of these definitions is
-- queued (due or not), leased, or waiting and due, or a concurrency key has a wake not yet
-- consumed (its admission may have been skipped under contention), which `toolkit run
-- --until-idle` waits for (a timer or signal wait not yet due does not count; a distributed
-- map whose children all ended does, reason 'map'). next_due: seconds until the
-- earliest future run_at of a queued or waiting task (a retry or a timer), or a little
-- sooner, so the worker wakes for it instead of polling. Tasks of paused tenants count for
-- neither (no worker may claim them). The waiting and future parts read index ranges tenant
-- by tenant (one short range each); the time bounds are sub-selects so that the planner
-- uses them as index bounds, not as filters over every waiting task.
--
-- The claim index is in claim-time order (due time less a minute per priority level,
-- migration 0017): its first future entry bounds every due time at or after it from below,
-- and is exact at priority 0. The exact due time of the tasks above priority 0 comes from
-- their own index. An entry of priority p is thus woken for at most once early, p minutes
-- before it is due, after which the second range reads it exactly: no busy wake-ups.
--
-- Only the tenants of the rotation are probed one by one (migration 0020): the ready ones,
-- and those not ready whose next_due has come. A tenant not ready has no task due before its
-- next_due (the rotation's invariant, which the claim relies on too), so for the others
-- next_due itself bounds their due times from below: an index range of the tenants, however
-- many there are. Waking at such a bound that turns out early costs one empty claim, which
-- promotes the tenant and demotes it again with an exact bound. Every comparison with now
-- uses one reading of the clock (now_at): a task due between two readings would count as
-- neither due nor ahead.
WITH now_at AS MATERIALIZED (
    SELECT statement_timestamp() AS at
), work AS (
    SELECT EXISTS (
           SELECT 1 FROM toolkit_tasks
           WHERE state IN ('queued', 'leased')
             AND definition_digest = ANY(%(digests)s::text[])
             AND tenant <> ALL (ARRAY(SELECT tenant FROM toolkit_tenants WHERE paused))
       )
       OR EXISTS (
           SELECT 1
           -- the probed tenants (a sub-select, not a CTE: Citus joins it to the tasks on
           -- their shards)
           FROM (SELECT tenant FROM toolkit_tenants WHERE ready AND NOT paused
                 UNION ALL
                 SELECT tenant FROM toolkit_tenants
                 WHERE NOT ready AND NOT paused AND next_due <= (SELECT at FROM now_at)) tn
           CROSS JOIN LATERAL (
               SELECT 1 FROM toolkit_tasks
               WHERE tenant = tn.tenant
                 AND state IN ('queued', 'leased', 'waiting') AND state = 'waiting'
                 AND (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                      AT TIME ZONE 'UTC') - priority * interval '1 minute'
                     <= (SELECT at AT TIME ZONE 'UTC' FROM now_at)
                 AND CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                     <= (SELECT at FROM now_at)
                 AND definition_digest = ANY(%(digests)s::text[])
               -- in index order: the planner then reads the due range, never choosing a
               -- scan of every parked task for a first row it will not find (issue 20)
               ORDER BY (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                         AT TIME ZONE 'UTC') - priority * interval '1 minute'
               LIMIT 1
           ) due
       )
       -- a distributed map none of whose children is live: its next count ends it (while
       -- children are live, they are the work to wait for, or wait for something outside).
       -- toolkit_tasks_map_waits holds these parents only, toolkit_tasks_map_live the live
       -- children.
       OR EXISTS (
           SELECT 1 FROM toolkit_tasks p
           WHERE p.state = 'waiting' AND p.wait_reason = 'map'
             AND p.definition_digest = ANY(%(digests)s::text[])
             AND p.tenant <> ALL (ARRAY(SELECT tenant FROM toolkit_tenants WHERE paused))
             AND NOT EXISTS (SELECT 1 FROM toolkit_tasks c
                             WHERE c.parent_id = p.id AND c.tenant = p.tenant
                               AND c.map_index IS NOT NULL
                               AND c.state IN ('queued', 'leased', 'waiting'))
       )
       -- a concurrency key has room for a task waiting for it (its wake is not consumed
       -- yet): the next claim admits it
       OR EXISTS (SELECT 1 FROM toolkit_key_wakes) AS pending
), ahead AS (
        SELECT min(first_claim.at_utc) AS first_claim, min(ahead.at) AS first_ahead
        FROM (SELECT tenant FROM toolkit_tenants WHERE ready AND NOT paused
              UNION ALL
              SELECT tenant FROM toolkit_tenants
              WHERE NOT ready AND NOT paused AND next_due <= (SELECT at FROM now_at)) tn
        LEFT JOIN LATERAL (
            -- the first future claim time: a lower bound of the due times after it
            SELECT (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                    AT TIME ZONE 'UTC') - priority * interval '1 minute' AS at_utc
            FROM toolkit_tasks
            WHERE tenant = tn.tenant
              AND state IN ('queued', 'leased', 'waiting') AND state <> 'leased'
              AND (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                   AT TIME ZONE 'UTC') - priority * interval '1 minute'
                  > (SELECT at AT TIME ZONE 'UTC' FROM now_at)
              AND definition_digest = ANY(%(digests)s::text[])
            ORDER BY (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                      AT TIME ZONE 'UTC') - priority * interval '1 minute'
            LIMIT 1
        ) first_claim ON true
        LEFT JOIN LATERAL (
            -- the first future due time above priority 0, exactly
            SELECT run_at AS at FROM toolkit_tasks
            WHERE tenant = tn.tenant AND priority > 0
              AND state IN ('queued', 'leased', 'waiting') AND state <> 'leased'
              AND CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                  > (SELECT at FROM now_at)
              AND definition_digest = ANY(%(digests)s::text[])
            ORDER BY CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
            LIMIT 1
        ) ahead ON true
)
-- (CTEs, not sub-selects in a target list, which Citus cannot push down)
SELECT work.pending,
       extract(epoch FROM least(ahead.first_claim AT TIME ZONE 'UTC', ahead.first_ahead,
                                (SELECT min(next_due) FROM toolkit_tenants
                                 WHERE NOT ready AND NOT paused))
                          - (SELECT at FROM now_at))::float8 AS next_due
FROM work, ahead;

-- name: send_signal
-- Stores a signal for a live task and wakes it when it already waits for that name. Whether
-- it waits is read from the row as locked here (its latest version), never from this
-- statement's snapshot: a wait committed while this statement queued for the row lock is
-- seen and woken. A wait committed after this statement finds it (the task was leased) is
-- woken by the worker's own commit (wake_raced_waits).
WITH target AS (
    SELECT id, tenant, state, wait_reason, checkpoint
    FROM toolkit_tasks WHERE id = %(task_id)s AND tenant = %(tenant)s FOR NO KEY UPDATE
), r AS (
    SELECT %(task_id)s::bigint AS task_id, %(payload)s::jsonb AS payload
),
-- include: signal_targets
SELECT (SELECT state FROM target) AS state,
       (SELECT id FROM inserted) AS signal_id,
       EXISTS (SELECT 1 FROM woken) AS woken,
       (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended;

-- fragment: signal_targets
-- Stores signal %(name)s for each live row of CTE target (id, tenant, state, wait_reason,
-- checkpoint, locked), with its payload from CTE r (task_id, payload), addressed to branch
-- %(address)s (null: the task as a whole), and makes those already waiting for it at the
-- task's level due now (a branch waiting for it is woken by wake_branches, the next
-- statement of the same transaction) (woken: their ids; notices: whether idle workers are to be woken, and no ended task); a
-- signal_received event names the signal, and %(plan_id)s and %(operator)s the bulk plan
-- and its operator (null for one task). An event delivered as a signal (%(event_id)s, null
-- for a signal) is stored once per task: a second delivery of it stores nothing. The
-- rotation's marks: due_marks.
-- include: due_in_statement
, inserted AS (
    INSERT INTO toolkit_signals (task_id, tenant, name, payload, address, event_id)
    SELECT target.id, target.tenant, %(name)s, r.payload, %(address)s::text,
           %(event_id)s::bigint
    FROM target JOIN r ON r.task_id = target.id
    WHERE target.state NOT IN ('succeeded', 'failed', 'cancelled')
    ON CONFLICT (task_id, event_id, tenant) WHERE event_id IS NOT NULL DO NOTHING
    RETURNING id, task_id, tenant
), woken AS (
    UPDATE toolkit_tasks t
    SET run_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM inserted i, target, due_in_statement
    WHERE t.id = i.task_id AND target.id = i.task_id
      AND target.state = 'waiting'
      AND target.wait_reason = 'signal' AND %(address)s::text IS NULL
      AND (target.checkpoint -> 'wait' ->> 'signal' = %(name)s
           OR coalesce(target.checkpoint -> 'wait' -> 'signals' ? %(name)s, false))
    RETURNING t.id, t.tenant, t.run_at
), made_due AS (
    SELECT tenant, run_at AS at FROM woken
),
-- include: due_marks
, events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, detail)
    SELECT task_id, tenant, 'signal_received', %(operator)s::text,
           jsonb_strip_nulls(jsonb_build_object('name', %(name)s, 'signal_id', id,
                                                'plan', %(plan_id)s::bigint,
                                                'event', %(event_id)s::bigint))
    FROM inserted
), notices AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM woken) THEN '' END AS wakeup, NULL::text[] AS ended
)

-- fragment: branch_wakes_due
-- The tasks of the branches that CTE woken gave a wake (task_id), if they wait for their
-- branches, are due now (with the rotation's marks); the statement's rows: their ids, and
-- idle workers are to be woken.
-- include: due_in_statement
, due AS (
    UPDATE toolkit_tasks t
    SET run_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM due_in_statement
    WHERE t.id IN (SELECT task_id FROM woken) AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
      AND t.state = 'waiting' AND t.wait_reason = 'branches'
    RETURNING t.id, t.tenant, t.run_at
), made_due AS (
    SELECT tenant, run_at AS at FROM due
),
-- include: due_marks
SELECT id, ''::text AS notify_toolkit_wakeup FROM due;

-- name: wake_branches
-- The second statement of a transaction that stored signals, completed a callback or ended
-- tasks (%(keys)s: [{task_id, key}], key 'signal:NAME', 'callback:TOKEN' or 'child:ID';
-- address: the branch a signal is for, or null). The first statement locked each task's
-- row, so this one's snapshot has every branch that parked before: each waiting branch
-- that waits for a key gets a wake (wakes + 1), and its task, if it waits for its
-- branches, is due now. A branch that parks later finds what it waits for at its own
-- commit (wake_waiting_branches).
WITH k AS (
    SELECT * FROM jsonb_to_recordset(%(keys)s::jsonb) AS k(task_id bigint, key text, address text)
), woken AS (
    UPDATE toolkit_branches b
    SET wakes = b.wakes + 1
    FROM k
    WHERE b.task_id = k.task_id AND (%(tenant)s::text IS NULL OR b.tenant = %(tenant)s) AND b.status = 'waiting'
      AND b.waits_for @> ARRAY[k.key]
      AND (k.address IS NULL OR regexp_replace(b.fanout || '/' || b.name, '[^/]*#[0-9]+/', '', 'g') = k.address)
    RETURNING b.task_id
),
-- include: branch_wakes_due

-- name: wake_parent_branches
-- The statement after one that ended tasks (%(task_ids)s), in its transaction: a waiting
-- branch of a parent that waits for one of them gets a wake, and the parent, if it waits
-- for its branches, is due now. The first statement locked each parent's row (it woke
-- it), so this snapshot has every branch the parent parked before.
WITH ended AS (
    SELECT id, parent_id FROM toolkit_tasks
    WHERE id = ANY(%(task_ids)s::bigint[]) AND (%(tenant)s::text IS NULL OR toolkit_tasks.tenant = %(tenant)s)
      AND parent_id IS NOT NULL
      AND state IN ('succeeded', 'failed', 'cancelled')
), woken AS (
    UPDATE toolkit_branches b
    SET wakes = b.wakes + 1
    FROM ended e
    WHERE b.task_id = e.parent_id AND (%(tenant)s::text IS NULL OR b.tenant = %(tenant)s) AND b.status = 'waiting'
      AND b.waits_for @> ARRAY['child:' || e.id::text]
    RETURNING b.task_id
),
-- include: branch_wakes_due

-- name: task_signals
SELECT id, name, address, payload, sent_at, consumed_at, consumed_by, consumed_token
FROM toolkit_signals
WHERE task_id = %(task_id)s AND tenant = %(tenant)s
ORDER BY id;

-- name: request_cancel
-- A queued, waiting or recoverable task is cancelled at once; a leased one gets a cancel
-- request that its holder learns of at its next heartbeat.
WITH target AS (
    SELECT id, state, lease_expires_at FROM toolkit_tasks
    WHERE id = %(task_id)s AND tenant = %(tenant)s FOR NO KEY UPDATE
),
-- include: cancel_targets
SELECT (SELECT state FROM target) AS previous_state,
       EXISTS (SELECT 1 FROM now_cancelled) AS cancelled,
       EXISTS (SELECT 1 FROM requested) AS requested,
       (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended;

-- name: cancel_tasks
-- request_cancel for the tasks %(task_ids)s at once, with one %(reason)s: the live
-- descendants of a cancelled task (Tasks.cancel_descendants), in one statement rather than
-- one each. Rows are locked in id order.
WITH target AS (
    SELECT id, state, lease_expires_at FROM toolkit_tasks t
    WHERE id = ANY(%(task_ids)s::bigint[]) AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
    ORDER BY id
    FOR NO KEY UPDATE
),
-- include: cancel_targets
SELECT ARRAY(SELECT id FROM now_cancelled ORDER BY id) AS cancelled,
       ARRAY(SELECT id FROM requested ORDER BY id) AS requested,
       (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended;

-- fragment: cancel_targets
-- Cancels the locked rows of CTE target (id, state, lease_expires_at): a queued, waiting or
-- recoverable task at once, a leased one by a request its holder learns of at its next
-- heartbeat; %(reason)s is the reason, %(plan_id)s and %(operator)s name the bulk plan and
-- its operator (null for one task). A task cancelled here wakes its parent, and ends as
-- task_ended says. notices: whether idle workers are to be woken, and the awaited tasks
-- that ended (their ids). The rotation's marks: due_marks.
-- include: ends_in_statement
,
-- include: due_in_statement
, now_cancelled AS (
    UPDATE toolkit_tasks t
    SET state = 'cancelled', wait_reason = NULL, lease_owner = NULL, lease_expires_at = NULL,
        error = jsonb_build_object('name', 'Cancelled', 'message', %(reason)s::text),
        cancel_requested = jsonb_build_object('reason', %(reason)s::text, 'at', statement_timestamp()),
        finished_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM target, ends_in_statement
    WHERE t.id = target.id AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
      AND (target.state IN ('queued', 'waiting')
           OR (target.state = 'leased' AND target.lease_expires_at <= statement_timestamp()))
    RETURNING t.id, t.tenant, t.state, t.definition_name, t.concurrency_key, t.key_held,
              t.schedule_name, t.awaited, t.checkpoint -> 'fanout' AS fanout
), ended AS (
    SELECT * FROM now_cancelled
),
-- include: task_ended
, reservation_returned AS (
    -- a task cancelled mid-step returns what its tenant's budget rows hold of the
    -- reservations its checkpoint records; their spend counts
    UPDATE toolkit_tenant_budgets b
    SET used = b.used - least(r.reserved, b.reserved) + r.spent,
        reserved = b.reserved - least(r.reserved, b.reserved)
    FROM (
        SELECT e.tenant, k.key AS resource, sum(k.value::numeric) AS reserved,
               sum(coalesce((e.fanout #>> ARRAY['spent', k.key])::numeric, 0)) AS spent
        FROM ended e
        CROSS JOIN LATERAL jsonb_each_text(e.fanout -> 'reserved') AS k
        WHERE jsonb_typeof(e.fanout -> 'reserved') = 'object'
        GROUP BY e.tenant, k.key
        ORDER BY e.tenant, k.key
    ) r
    WHERE b.tenant = r.tenant AND (%(tenant)s::text IS NULL OR b.tenant = %(tenant)s) AND b.resource = r.resource
), requested AS (
    UPDATE toolkit_tasks t
    SET cancel_requested = jsonb_build_object('reason', %(reason)s::text, 'at', statement_timestamp()),
        updated_at = statement_timestamp()
    FROM target
    WHERE t.id = target.id AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
      AND target.state = 'leased' AND target.lease_expires_at > statement_timestamp()
    RETURNING t.id, t.tenant
), woken_parent AS (
    -- A child cancelled here wakes its parent, as a child ending under a lease does.
    UPDATE toolkit_tasks p
    SET child_wake = true,
        run_at = CASE WHEN p.state = 'waiting' AND p.wait_reason IN ('child', 'branches')
                      THEN (SELECT statement_timestamp()) ELSE p.run_at END
    FROM toolkit_tasks c, due_in_statement
    WHERE c.id IN (SELECT id FROM now_cancelled) AND (%(tenant)s::text IS NULL OR c.tenant = %(tenant)s)
      AND p.id = c.parent_id AND (%(tenant)s::text IS NULL OR p.tenant = %(tenant)s) AND c.map_index IS NULL
      AND p.state IN ('leased', 'waiting')
      AND p.id NOT IN (SELECT id FROM target)  -- cancelled here too: its row is written above
    RETURNING p.id, p.tenant, p.state, p.run_at
), made_due AS (
    SELECT tenant, run_at AS at FROM woken_parent WHERE state = 'waiting'
),
-- include: due_marks
, notices AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM woken_parent) OR EXISTS (SELECT 1 FROM ended_wakeup)
                THEN '' END AS wakeup,
           (SELECT ids FROM ended_awaited) AS ended
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, detail)
    SELECT id, tenant, 'cancelled', %(operator)s::text,
           jsonb_strip_nulls(jsonb_build_object('reason', %(reason)s::text,
                                                'plan', %(plan_id)s::bigint))
    FROM now_cancelled
    UNION ALL
    SELECT id, tenant, 'cancel_requested', %(operator)s::text,
           jsonb_strip_nulls(jsonb_build_object('reason', %(reason)s::text,
                                                'plan', %(plan_id)s::bigint))
    FROM requested
)

-- name: reconcile_effect
-- An operator (or the application) records the real outcome of an effect whose intent has
-- no outcome, or asks for a new call; the task is queued again with the resolution in its
-- checkpoint, for the interpreter to apply. Refused (no row) unless the task waits for
-- reconciliation of exactly this occurrence.
WITH reconciling AS (
    SELECT id, lease_token, %(occurrence)s::text AS occurrence,
           %(resolution)s::jsonb AS resolution
    FROM toolkit_tasks
    WHERE id = %(task_id)s AND tenant = %(tenant)s
      AND state = 'waiting' AND wait_reason = 'reconciliation'
      AND checkpoint ->> 'pending' = %(occurrence)s
    FOR NO KEY UPDATE
),
-- include: reconcile_targets
SELECT id, (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended FROM updated;

-- fragment: reconcile_targets
-- Records the outcome of the pending occurrence of each row of CTE reconciling (id,
-- lease_token, occurrence, resolution; locked, waiting for that reconciliation): evidence
-- of %(record)s (none for a retry) under the task's token, by %(operator)s, with
-- %(result)s or %(error)s; the resolution in the checkpoint; the task queued again
-- (updated: id, tenant, resolution; notices: whether idle workers are to be woken, and no
-- ended task); a reconciled event, naming bulk plan %(plan_id)s
-- when there is one. The rotation's marks: due_marks.
-- include: due_in_statement
, evidence AS (
    INSERT INTO toolkit_effect_evidence
        (task_id, tenant, occurrence, step, handler, idempotent, idempotency_key, record,
         attempt, fencing_token, worker_id, result, error)
    SELECT g.id, e.tenant, e.occurrence, e.step, e.handler, e.idempotent, e.idempotency_key,
           %(record)s::text, e.attempt, g.lease_token, %(operator)s, %(result)s::jsonb,
           %(error)s::jsonb
    FROM reconciling g
    -- each one's latest started record (DISTINCT ON, not a LATERAL ... LIMIT 1, which
    -- Citus cannot push down)
    JOIN (
        SELECT DISTINCT ON (x.task_id, x.occurrence) x.*
        FROM toolkit_effect_evidence x
        WHERE (x.task_id, x.occurrence) IN (SELECT id, occurrence FROM reconciling)
          AND (%(tenant)s::text IS NULL OR x.tenant = %(tenant)s) AND x.record = 'started'
        ORDER BY x.task_id, x.occurrence, x.id DESC
    ) e ON e.task_id = g.id AND e.occurrence = g.occurrence
    WHERE %(record)s::text IS NOT NULL
), updated AS (
    UPDATE toolkit_tasks t
    SET state = 'queued', wait_reason = NULL, run_at = statement_timestamp(),
        checkpoint = jsonb_set(t.checkpoint, '{resolution}', g.resolution),
        updated_at = statement_timestamp()
    FROM reconciling g, due_in_statement
    WHERE t.id = g.id AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
    RETURNING t.id, t.tenant, t.run_at, g.resolution
), made_due AS (
    SELECT tenant, run_at AS at FROM updated
),
-- include: due_marks
, notices AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM updated) THEN '' END AS wakeup, NULL::text[] AS ended
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, detail)
    SELECT id, tenant, 'reconciled', %(operator)s,
           resolution || CASE WHEN %(plan_id)s::bigint IS NULL THEN '{}'::jsonb
                              ELSE jsonb_build_object('plan', %(plan_id)s::bigint) END
    FROM updated
)

-- name: task_definition_body
-- The definition body a task is pinned to (by digest), with its checkpoint.
SELECT d.body, t.checkpoint, t.state
FROM toolkit_tasks t
LEFT JOIN toolkit_definitions d ON d.digest = t.definition_digest
WHERE t.id = %(task_id)s AND t.tenant = %(tenant)s;

-- name: key_live_tasks
-- The live tasks of a concurrency key (docs/flow-control.md), oldest first: those holding it,
-- then those waiting for it; at most %(limit)s of each (null: all).
(SELECT id, true AS held FROM toolkit_tasks
 WHERE tenant = %(tenant)s AND definition_name = %(name)s AND concurrency_key = %(key)s
   AND key_held AND state IN ('queued', 'leased', 'waiting')
 ORDER BY id LIMIT %(limit)s)
UNION ALL
(SELECT id, false FROM toolkit_tasks
 WHERE tenant = %(tenant)s AND definition_name = %(name)s AND concurrency_key = %(key)s
   AND state = 'waiting' AND wait_reason = 'concurrency'
 ORDER BY id LIMIT %(limit)s);

-- name: admit_keys
-- Admits tasks waiting for their concurrency keys (toolkit_admit_keys, migration 0015):
-- run by a claimer before it claims while wake rows exist.
SELECT admitted, remaining FROM toolkit_admit_keys(%(max_keys)s);

-- name: task_by_idempotency_key
SELECT id FROM toolkit_tasks WHERE tenant = %(tenant)s AND idempotency_key = %(key)s;

-- name: submit_debounced_task
-- A debounced submit (docs/flow-control.md): a new task waiting (reason debounce) until
-- database now + %(quiet)s seconds, unless the tenant's task of this definition and debounce
-- key still waits so: that one takes this submit's input, tags, version and checkpoint, and
-- waits on until now + quiet, but never past its first submit + %(max_wait)s seconds. The
-- rotation's marks (due_marks) count the new or moved task as made due sooner; the tenant
-- is registered before (register_tenant).
WITH
-- include: due_in_statement
, submitted AS (
    INSERT INTO toolkit_tasks AS t
        (tenant, definition_name, definition_version, definition_digest, input, checkpoint,
         deadline_at, tags, priority, trace_parent, debounce_key, state, wait_reason, run_at,
         updated_at)
    SELECT %(tenant)s, %(name)s, %(version)s, %(digest)s, %(input)s, %(checkpoint)s,
           statement_timestamp() + %(timeout)s::float8 * interval '1 second', %(tags)s,
           %(priority)s, %(trace_parent)s,
           %(debounce_key)s, 'waiting', 'debounce',
           statement_timestamp() + least(%(quiet)s::float8, %(max_wait)s::float8,
                                     %(timeout)s::float8) * interval '1 second',
           statement_timestamp()
    FROM due_in_statement
    ON CONFLICT (tenant, definition_name, debounce_key)
        WHERE state = 'waiting' AND wait_reason = 'debounce'
    DO UPDATE SET
        input = EXCLUDED.input, tags = EXCLUDED.tags, checkpoint = EXCLUDED.checkpoint,
        definition_version = EXCLUDED.definition_version,
        definition_digest = EXCLUDED.definition_digest,
        deadline_at = EXCLUDED.deadline_at, priority = EXCLUDED.priority,
        -- from the inserted row's time (updated_at), with toolkit_seconds_after (Citus
        -- refuses a function that is not immutable here: migration 0034); least() leaves
        -- out a null (no max_wait, no deadline)
        run_at = least(toolkit_seconds_after(EXCLUDED.updated_at, %(quiet)s::float8),
                       toolkit_seconds_after(t.created_at, %(max_wait)s::float8),
                       EXCLUDED.deadline_at),
        updated_at = EXCLUDED.updated_at
    RETURNING id, xmax = 0 AS created, tenant, run_at
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
    SELECT id, %(tenant)s, CASE WHEN created THEN 'submitted' ELSE 'debounced' END,
           jsonb_build_object('debounce_key', %(debounce_key)s::text)
    FROM submitted
), made_due AS (
    SELECT tenant, run_at AS at FROM submitted
),
-- include: due_marks

-- a new task wakes idle workers (their next wake-up is its start), a moved one need not
SELECT id, created, CASE WHEN created THEN '' END AS notify_toolkit_wakeup
FROM submitted;

-- name: take_throttle_start
-- A throttled submit takes a start of its key (GCRA: %(interval)s seconds apart on average,
-- a burst of %(calls)s at once): returns the seconds until the start it took (0: now). Past
-- the rate with %(delay)s false nothing is taken and nothing returned. The times are made
-- from the inserted row's (taken_at: the statement's time) with toolkit_seconds_after
-- (migration 0034): Citus refuses a function that is not immutable in DO UPDATE, in the
-- ON CONFLICT WHERE and in RETURNING.
INSERT INTO toolkit_throttle_keys AS k (tenant, definition_name, throttle_key, next_at, taken_at)
VALUES (%(tenant)s, %(name)s, %(key)s,
        toolkit_seconds_after(statement_timestamp(), %(interval)s::float8),
        statement_timestamp())
ON CONFLICT (tenant, definition_name, throttle_key) DO UPDATE
SET next_at = greatest(toolkit_seconds_after(k.next_at, %(interval)s::float8), EXCLUDED.next_at),
    taken_at = EXCLUDED.taken_at
WHERE %(delay)s::boolean
   OR greatest(toolkit_seconds_after(k.next_at, %(interval)s::float8), EXCLUDED.next_at)
      <= toolkit_seconds_after(EXCLUDED.taken_at, %(period)s::float8)
RETURNING greatest(extract(epoch FROM k.next_at - k.taken_at) - %(period)s::float8,
                   0)::float8 AS start_in;

-- name: throttle_free_in
-- Seconds until a throttled key has a start free (0: now).
SELECT greatest(extract(epoch FROM next_at - statement_timestamp()) + %(interval)s::float8
                - %(period)s::float8, 0)::float8 AS free_in
FROM toolkit_throttle_keys
WHERE tenant = %(tenant)s AND definition_name = %(name)s AND throttle_key = %(key)s;

-- name: key_health
-- For `toolkit doctor`: the concurrency keys with the most tasks waiting for them (at most
-- 5), and how long the oldest has waited (seconds since its submit, database time). Reads
-- only the tasks waiting for keys (toolkit_tasks_key_queue), never the holders.
SELECT tenant, definition_name, concurrency_key, count(*) AS waiting,
       extract(epoch FROM statement_timestamp() - min(created_at))::float8 AS oldest_wait
FROM toolkit_tasks
WHERE state = 'waiting' AND wait_reason = 'concurrency'
GROUP BY tenant, definition_name, concurrency_key
ORDER BY count(*) DESC, min(created_at)
LIMIT 5;

-- name: tenant_health
-- For `toolkit doctor`: the unpaused tenants with the most due tasks not running (at most
-- 5): how many, how long the oldest has been due (seconds, database time), their unexpired
-- leases, max_active and weight. Reads the live tasks once: an operator's command, not a
-- worker's path.
WITH due AS (
    SELECT tenant, count(*) AS due,
           extract(epoch FROM statement_timestamp()
                   - min(CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END)
           )::float8 AS oldest_due
    FROM toolkit_tasks
    WHERE state IN ('queued', 'leased', 'waiting')
      AND CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END <= statement_timestamp()
    GROUP BY tenant
)
SELECT d.tenant, d.due, d.oldest_due, tn.max_active, tn.weight,
       (SELECT count(*) FROM toolkit_tasks a
        WHERE a.tenant = d.tenant AND a.state = 'leased'
          AND a.lease_expires_at > statement_timestamp()) AS active
FROM due d
JOIN toolkit_tenants tn ON tn.tenant = d.tenant
WHERE NOT tn.paused
ORDER BY d.due DESC, d.tenant
LIMIT 5;

-- name: task_queue_position
-- For `toolkit show`: whether a task is due for a claim, and why it is not running yet. Its
-- tenant's settings and unexpired leases, how many due tasks of its tenant come before it
-- in claim order (due time less priority, then id: the tasks of one submit share a due
-- time; at most 10,000 counted: an index range of the claim index), and whether a live
-- worker has loaded its definition version.
SELECT t.state IN ('queued', 'waiting') AND t.run_at <= statement_timestamp() AS due,
       tn.paused, tn.max_active,
       (SELECT count(*) FROM toolkit_tasks a
        WHERE a.tenant = %(tenant)s AND a.state = 'leased'
          AND a.lease_expires_at > statement_timestamp()) AS active,
       (SELECT count(*) FROM (
            SELECT 1 FROM toolkit_tasks a
            WHERE a.tenant = %(tenant)s AND a.state IN ('queued', 'leased', 'waiting')
              AND ((CASE WHEN a.state = 'leased' THEN a.lease_expires_at ELSE a.run_at END
                    AT TIME ZONE 'UTC') - a.priority * interval '1 minute', a.id)
                  < ((t.run_at AT TIME ZONE 'UTC') - t.priority * interval '1 minute', t.id)
              AND CASE WHEN a.state = 'leased' THEN a.lease_expires_at ELSE a.run_at END
                  <= statement_timestamp()
            LIMIT 10000) ahead) AS ahead,
       EXISTS (SELECT 1 FROM toolkit_workers w
               WHERE w.stopped_at IS NULL AND w.expires_at > statement_timestamp()
                 AND w.definitions @> jsonb_build_array(
                         jsonb_build_object('digest', t.definition_digest))) AS served
FROM toolkit_tasks t
JOIN toolkit_tenants tn ON tn.tenant = %(tenant)s
WHERE t.id = %(task_id)s AND t.tenant = %(tenant)s;

-- name: held_tasks
-- include: held_task_counts

-- fragment: held_task_counts
-- Live tasks held back now, by definition and why (the toolkit_tasks_held gauge, counted
-- by one worker of the fleet every 15 s with the definition-unavailable one): not due yet,
-- waiting for their concurrency key, a debounce, a delayed or throttled start, a budget or
-- a limit (their run_at, 'infinity' for a key, not passed); due but their tenant paused,
-- or at its max_active (unexpired leases, counted once per such tenant). Reads the live tasks
-- once, as the definition-unavailable count does: a watch's statement, not the claim's.
SELECT definition_name, wait_reason AS reason, count(*) AS n
FROM toolkit_tasks
WHERE state = 'waiting'
  AND wait_reason IN ('concurrency', 'debounce', 'start', 'budget', 'limit')
  AND (run_at IS NULL OR run_at > statement_timestamp())
GROUP BY definition_name, wait_reason
UNION ALL
SELECT t.definition_name,
       CASE WHEN tn.paused THEN 'tenant_paused' ELSE 'tenant_max_active' END AS reason,
       count(*) AS n
FROM toolkit_tenants tn
JOIN toolkit_tasks t
  ON t.tenant = tn.tenant AND t.state IN ('queued', 'waiting') AND t.run_at <= statement_timestamp()
WHERE tn.paused
   OR (tn.max_active IS NOT NULL
       AND tn.max_active <= (SELECT count(*) FROM toolkit_tasks a
                             WHERE a.tenant = tn.tenant AND a.state = 'leased'
                               AND a.lease_expires_at > statement_timestamp()))
GROUP BY t.definition_name, tn.paused
