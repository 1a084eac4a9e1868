-- fragment: task_ended
-- What a task's end does beyond its own row, done by the statement that ends it: no trigger
-- does it, since a distributed table can have none (issue 25; docs/scaling.md). CTE ended
-- holds the tasks this statement moved from a live state to succeeded, failed or cancelled:
-- id, tenant, state, definition_name, concurrency_key, key_held, schedule_name, awaited,
-- fanout (their checkpoint's). Returning a reservation an ended task still holds is the
-- including statement's (it may change the same budget rows for other reasons).
-- The including statement must also say that it does this work, before it changes a task
-- row: its ending UPDATE joins CTE ends_in_statement (see that fragment).
-- * A holder of a concurrency key leaves a wake row for the admission: its key has room
--   (key_released). When a task waits for that key, idle workers are to be woken
--   (ended_wakeup: a row then).
-- * A scheduled run that succeeded or failed counts for its schedule's
--   pause_after_failures: a failure adds one to its consecutive failures and pauses it at
--   the limit (a null limit: never), a success resets them. Several runs of one schedule
--   that end together count in id order: each failure's streak is the failures since the
--   last success before it (added to the stored count when there is none), and the
--   schedule pauses at the first failure whose streak reaches the limit.
-- * ended_awaited: the ids of the awaited tasks, to announce on channel toolkit_task_ended
--   (null for none: a null result column costs its reader nothing).
-- include: key_released
,
-- include: ended_wakeup
,
-- include: schedule_outcomes
,
-- include: ended_awaited

-- fragment: task_ended_on_shard
-- task_ended but what it inserts or changes off the shard, for a statement routed to one
-- shard of a store distributed by tenant (commit_fenced_on_shard): Citus routes no statement
-- that inserts in a CTE, and the schedules are a reference table. The caller inserts the
-- keys' wake rows and counts the scheduled runs' outcomes in the same transaction
-- (record_key_wake, count_schedule_outcomes).
-- include: ended_wakeup
,
-- include: ended_awaited

-- fragment: key_released
-- task_ended's wake rows of the concurrency keys its ended holders released (CTE ended:
-- tenant, definition_name, concurrency_key, key_held).
key_released AS (
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    SELECT tenant, definition_name, concurrency_key FROM ended WHERE key_held
)

-- fragment: ended_wakeup
-- task_ended's test whether a task waits for a key its ended holders released (a row then).
ended_wakeup AS (
    SELECT 1 WHERE EXISTS (
        SELECT 1
        FROM ended k
        JOIN toolkit_tasks t
          ON t.tenant = k.tenant AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
         AND t.definition_name = k.definition_name
         AND t.concurrency_key = k.concurrency_key
        WHERE k.key_held AND t.state = 'waiting' AND t.wait_reason = 'concurrency')
)

-- fragment: schedule_outcomes
-- task_ended's scheduled runs that succeeded or failed, counted for their schedules (CTE
-- ended: id, schedule_name, state).
schedule_runs AS (
    SELECT e.id, e.schedule_name, e.state,
           max(e.id) FILTER (WHERE e.state = 'succeeded')
               OVER (PARTITION BY e.schedule_name ORDER BY e.id) AS last_success
    FROM ended e
    WHERE e.schedule_name IS NOT NULL AND e.state IN ('succeeded', 'failed')
), schedule_streaks AS (
    -- a failure after a success: its streak since that success, which no stored count joins
    SELECT r.*,
           count(*) FILTER (WHERE r.state = 'failed')
               OVER (PARTITION BY r.schedule_name, r.last_success ORDER BY r.id) AS streak
    FROM schedule_runs r
), schedule_outcomes AS (
    SELECT r.schedule_name,
           -- the failures before the first success, which continue the stored count
           ARRAY(SELECT h.id FROM schedule_runs h
                 WHERE h.schedule_name = r.schedule_name AND h.last_success IS NULL
                   AND h.state = 'failed'
                 ORDER BY h.id) AS head,
           bool_or(r.state = 'succeeded') AS reset,
           coalesce(max(r.streak) FILTER (
               WHERE r.state = 'failed'
                 AND r.last_success = (SELECT max(x.id) FROM schedule_runs x
                                       WHERE x.schedule_name = r.schedule_name
                                         AND x.state = 'succeeded')), 0) AS tail,
           min(r.id) FILTER (WHERE r.state = 'failed' AND r.last_success IS NOT NULL
                               AND r.streak >= s.pause_after_failures) AS later_pause
    FROM schedule_streaks r
    JOIN toolkit_schedules s ON s.name = r.schedule_name
    GROUP BY r.schedule_name
), schedule_counted AS (
    -- The stored count and limit are read from the row as locked (a run of the schedule
    -- that ends in another transaction at the same time counts too): the k-th failure
    -- before the first success has streak consecutive_failures + k.
    UPDATE toolkit_schedules s
    SET (consecutive_failures, paused, pause_note, updated_at) = (
        SELECT CASE WHEN o.reset THEN o.tail
                    ELSE s.consecutive_failures + cardinality(o.head) END,
               s.paused OR p.task IS NOT NULL,
               CASE WHEN NOT s.paused AND p.task IS NOT NULL
                    THEN format('paused after %%s consecutive failures (the last: task %%s)',
                                p.streak, p.task)
                    ELSE s.pause_note END,
               statement_timestamp()
        FROM (SELECT greatest(s.pause_after_failures - s.consecutive_failures, 1) AS k) h
        CROSS JOIN LATERAL (
            SELECT CASE WHEN s.pause_after_failures IS NOT NULL
                        THEN coalesce(o.head[h.k], o.later_pause) END AS task,
                   CASE WHEN o.head[h.k] IS NOT NULL THEN s.consecutive_failures + h.k
                        ELSE s.pause_after_failures END AS streak
        ) p
    )
    FROM schedule_outcomes o
    WHERE s.name = o.schedule_name
)

-- fragment: ended_awaited
-- task_ended's awaited tasks to announce (ids; null for none).
ended_awaited AS (
    SELECT (SELECT array_agg(id::text ORDER BY id) FROM ended WHERE awaited) AS ids
)

-- fragment: ends_in_statement
-- A one-row CTE that an ending UPDATE joins, so that it is evaluated before any task row
-- changes: it says, for the statement's transaction, that the statement does what a task's
-- end does itself (task_ended). The triggers that did it before migration 0029, kept for
-- the previous release's workers during an upgrade, then leave it alone. (A trigger's WHEN
-- is evaluated as each row is updated, so the setting must come first.)
ends_in_statement AS (
    SELECT set_config('toolkit.ends_in_statement', 'on', true) AS flag
)

-- name: count_schedule_outcomes
-- The outcomes of scheduled runs ended by a statement routed to one shard
-- (commit_fenced_on_shard: a store distributed by tenant), counted for their schedules as
-- task_ended counts them, in the same transaction: runs %(ids)s of schedules %(schedules)s,
-- each succeeded or failed (%(states)s), in id order. Returns the runs given.
WITH ended AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(schedules)s::text[], %(states)s::text[])
         AS e(id, schedule_name, state)
),
-- include: schedule_outcomes
SELECT cardinality(%(ids)s::bigint[]) AS runs;
