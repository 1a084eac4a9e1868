-- Bulk plans (docs/many-tasks.md, "Bulk actions"): a plan records the tasks a filter matched
-- with the fencing token and state each had; applying it acts on a task only if both are
-- still the same, once per (plan, task).

-- name: create_bulk_plan
-- The plan and its tasks: those the filter matches in a state the action applies to (and,
-- for a reconciliation, waiting to reconcile an occurrence of step %(reconcile_step)s).
WITH plan AS (
    INSERT INTO toolkit_bulk_plans (action, arguments, filter, operator)
    VALUES (%(action)s, %(arguments)s, %(filter)s, %(operator)s)
    RETURNING id
), items AS (
    INSERT INTO toolkit_bulk_plan_tasks (plan_id, task_id, tenant, lease_token, state)
    SELECT plan.id, t.id, t.tenant, t.lease_token, t.state
    FROM plan, toolkit_tasks t
    WHERE t.state = ANY(%(actionable)s::text[])
      AND (%(reconcile_step)s::text IS NULL
           OR (t.wait_reason = 'reconciliation'
               AND %(reconcile_step)s::text IN (
                   split_part(t.checkpoint ->> 'pending', '#', 1),
                   split_part(regexp_replace(t.checkpoint ->> 'pending', '^.*/', ''), '#', 1))))
      AND
-- include: task_filter
    RETURNING task_id
)
SELECT (SELECT id FROM plan) AS id, (SELECT count(*) FROM items) AS planned;

-- name: get_bulk_plan
-- A plan with its items' outcomes counted (the items grouped first: a store distributed by
-- tenant counts them on each shard).
SELECT p.id, p.action, p.arguments, p.filter, p.operator, p.created_at, p.finished_at,
       coalesce(i.planned, 0) AS planned, coalesce(i.applied, 0) AS applied,
       coalesce(i.moved, 0) AS moved, coalesce(i.gone, 0) AS gone,
       coalesce(i.refused, 0) AS refused
FROM toolkit_bulk_plans p
LEFT JOIN (
    SELECT count(*) AS planned,
           count(*) FILTER (WHERE outcome = 'applied') AS applied,
           count(*) FILTER (WHERE outcome = 'moved') AS moved,
           count(*) FILTER (WHERE outcome = 'gone') AS gone,
           count(*) FILTER (WHERE outcome = 'refused') AS refused
    FROM toolkit_bulk_plan_tasks
    WHERE plan_id = %(plan_id)s
) i ON true
WHERE p.id = %(plan_id)s;

-- name: bulk_plan_counts
-- The planned tasks by the state and definition they had when planned.
SELECT i.state, t.definition_name, t.definition_version, count(*) AS n
FROM toolkit_bulk_plan_tasks i
JOIN toolkit_tasks t ON t.id = i.task_id AND t.tenant = i.tenant
WHERE i.plan_id = %(plan_id)s
GROUP BY i.state, t.definition_name, t.definition_version
ORDER BY i.state, t.definition_name, t.definition_version;

-- name: bulk_plan_digests
-- The definitions the planned tasks are pinned to, with their bodies (a signal's checks).
SELECT DISTINCT t.definition_digest AS digest, t.definition_name AS name,
       t.definition_version AS version, d.body
FROM toolkit_bulk_plan_tasks i
JOIN toolkit_tasks t ON t.id = i.task_id AND t.tenant = i.tenant
LEFT JOIN toolkit_definitions d ON d.digest = t.definition_digest
WHERE i.plan_id = %(plan_id)s;

-- name: bulk_open_items
-- The next tasks of a plan not acted on yet, with their tenants (a batch is applied tenant
-- by tenant) and what an action needs of each.
SELECT i.task_id, i.tenant, t.definition_digest AS digest, t.checkpoint ->> 'pending' AS pending
FROM toolkit_bulk_plan_tasks i
LEFT JOIN toolkit_tasks t ON t.id = i.task_id AND t.tenant = i.tenant
WHERE i.plan_id = %(plan_id)s AND i.outcome IS NULL
ORDER BY i.task_id
LIMIT %(limit)s;

-- name: bulk_plan_moved
-- The tasks of a plan that were not acted on, with why and what they are now.
SELECT i.task_id, i.outcome, i.state AS planned_state, i.lease_token AS planned_token,
       t.state, t.lease_token, i.detail ->> 'reason' AS reason
FROM toolkit_bulk_plan_tasks i
LEFT JOIN toolkit_tasks t ON t.id = i.task_id AND t.tenant = i.tenant
WHERE i.plan_id = %(plan_id)s AND i.outcome IN ('moved', 'gone', 'refused')
ORDER BY i.task_id
LIMIT %(limit)s;

-- name: finish_bulk_plan
UPDATE toolkit_bulk_plans SET finished_at = statement_timestamp()
WHERE id = %(plan_id)s AND finished_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM toolkit_bulk_plan_tasks
                  WHERE plan_id = %(plan_id)s AND outcome IS NULL);

-- fragment: bulk_items
-- The batch's tasks (%(task_ids)s, all of tenant %(tenant)s: a statement on one shard of a
-- store distributed by tenant) of plan %(plan_id)s not acted on yet (item), and target:
-- those of them whose fencing token and state are still what the plan recorded, each
-- locked with its item (compare-and-set: a task a worker claimed, wrote or ended since has
-- another token or state and is not touched; a second apply running at once waits for the
-- items, then finds them acted on). Target reads the items' table, not item: Citus 13.2,
-- running a statement CTE by CTE, fails on a locking CTE that reads another one's result.
item AS (
    SELECT i.task_id, i.lease_token, i.state
    FROM toolkit_bulk_plan_tasks i
    WHERE i.plan_id = %(plan_id)s AND i.task_id = ANY(%(task_ids)s::bigint[])
      AND i.tenant = %(tenant)s AND i.outcome IS NULL
), target AS (
    SELECT t.id, t.tenant, t.state, t.wait_reason, t.lease_expires_at, t.lease_token,
           t.checkpoint
    FROM toolkit_tasks t
    JOIN toolkit_bulk_plan_tasks i
      ON i.task_id = t.id AND i.tenant = t.tenant AND i.plan_id = %(plan_id)s
    WHERE t.tenant = %(tenant)s AND t.id = ANY(%(task_ids)s::bigint[])
      AND i.outcome IS NULL AND t.lease_token = i.lease_token AND t.state = i.state
    ORDER BY t.id
    FOR NO KEY UPDATE OF t, i
)

-- fragment: bulk_marked
-- Each item of the batch gets its outcome, in the statement that acted (CTE acted: task_id,
-- detail; and CTE wakeup, a row when idle workers are to be woken): applied; refused (unchanged, but the action's own check refused it); moved (its
-- token or state changed since the plan); gone (the task was deleted).
marked AS (
    UPDATE toolkit_bulk_plan_tasks i
    SET outcome = CASE
            WHEN a.task_id IS NOT NULL THEN 'applied'
            WHEN item.task_id IN (SELECT id FROM target) THEN 'refused'
            WHEN EXISTS (SELECT 1 FROM toolkit_tasks x
                         WHERE x.id = item.task_id AND x.tenant = %(tenant)s) THEN 'moved'
            ELSE 'gone' END,
        detail = a.detail,
        applied_at = statement_timestamp()
    FROM item
    LEFT JOIN acted a ON a.task_id = item.task_id
    WHERE i.plan_id = %(plan_id)s AND i.task_id = item.task_id AND i.tenant = %(tenant)s
      AND i.outcome IS NULL  -- (read again once a second apply's lock is released)
    RETURNING i.task_id, i.outcome
)
SELECT task_id, outcome, (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended
FROM marked ORDER BY task_id;

-- name: bulk_cancel
WITH
-- include: bulk_items
,
-- include: cancel_targets
, acted AS (
    SELECT id AS task_id, '{"cancel": "cancelled"}'::jsonb AS detail FROM now_cancelled
    UNION ALL
    SELECT id, '{"cancel": "requested"}'::jsonb FROM requested
),
-- include: bulk_marked
;

-- name: bulk_signal
-- Stores signal %(name)s for each unchanged task, with its payload (%(rows)s: task_id,
-- payload, checked against the schema of its definition's wait step), and wakes those
-- waiting for it, as send_signal does for one (the same fragment).
WITH
-- include: bulk_items
, r AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(task_id bigint, payload jsonb)
),
-- include: signal_targets
, acted AS (
    SELECT task_id, jsonb_build_object('signal_id', id) AS detail FROM inserted
),
-- include: bulk_marked
;

-- name: bulk_reconcile
-- Records the outcome of the pending effect of each unchanged task waiting for its
-- reconciliation (%(rows)s: task_id, occurrence, resolution), as reconcile_effect does for
-- one (the same fragment): evidence (unless a retry), the resolution in the checkpoint,
-- queued again.
WITH
-- include: bulk_items
, r AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
        AS r(task_id bigint, occurrence text, resolution jsonb)
), reconciling AS (
    SELECT target.id, target.lease_token, r.occurrence, r.resolution
    FROM target JOIN r ON r.task_id = target.id
    WHERE target.state = 'waiting' AND target.checkpoint ->> 'pending' = r.occurrence
),
-- include: reconcile_targets
, acted AS (
    SELECT id AS task_id, jsonb_build_object('outcome', resolution ->> 'outcome') AS detail
    FROM updated
),
-- include: bulk_marked
;

-- name: delete_bulk_plan
-- A plan refused after it was made (a signal no matched definition waits for), and its items
-- (a store distributed by tenant has no foreign key to delete them with it).
WITH plan AS (
    DELETE FROM toolkit_bulk_plans WHERE id = %(plan_id)s AND finished_at IS NULL RETURNING id
)
DELETE FROM toolkit_bulk_plan_tasks WHERE plan_id IN (SELECT id FROM plan);

-- name: set_bulk_plan_arguments
UPDATE toolkit_bulk_plans SET arguments = %(arguments)s WHERE id = %(plan_id)s;

-- name: bulk_lock_item
-- One task's item of plan %(plan_id)s (task %(task_id)s of tenant %(tenant)s), locked while
-- it is acted on alone (a redrive), if it is not acted on yet: a second apply running at
-- once waits, then finds it done.
SELECT i.task_id, i.lease_token, i.state
FROM toolkit_bulk_plan_tasks i
WHERE i.plan_id = %(plan_id)s AND i.task_id = %(task_id)s AND i.tenant = %(tenant)s
  AND i.outcome IS NULL
FOR UPDATE;

-- name: bulk_mark_item
-- The outcome of one task's item of plan %(plan_id)s (task %(task_id)s of tenant
-- %(tenant)s) acted on alone, with its detail.
UPDATE toolkit_bulk_plan_tasks
SET outcome = %(outcome)s, detail = %(detail)s, applied_at = statement_timestamp()
WHERE plan_id = %(plan_id)s AND task_id = %(task_id)s AND tenant = %(tenant)s
  AND outcome IS NULL;

-- name: lock_task_state
-- A task's state and fencing token, its row locked as a redrive locks it (so the compare
-- with a plan item holds until the transaction ends).
SELECT state, lease_token FROM toolkit_tasks
WHERE id = %(task_id)s AND tenant = %(tenant)s
FOR NO KEY UPDATE;

-- name: bulk_plan_task_ids
-- Every task of plan %(plan_id)s with its tenant, in id order (a redrive plan's preview
-- plans each).
SELECT task_id, tenant FROM toolkit_bulk_plan_tasks WHERE plan_id = %(plan_id)s ORDER BY task_id;
