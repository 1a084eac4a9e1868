-- name: audit_snapshot
-- The fencing audit reads a page of histories in one consistent, read-only snapshot, so a
-- task row, its events and its evidence are seen at the same moment even while workers run.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: audit_task_page
-- The next %(limit)s task ids after %(after)s, in id order: the audit pages through every
-- task without holding one long snapshot over the whole table.
SELECT id
FROM toolkit_tasks
WHERE id > %(after)s
ORDER BY id
LIMIT %(limit)s;

-- name: audit_tasks
-- The task rows the audit needs: the tenant, the state (terminal or not) and the last token
-- issued.
SELECT id, tenant, state, lease_token
FROM toolkit_tasks
WHERE id = ANY(%(task_ids)s::bigint[])
ORDER BY id;

-- name: audit_events
-- Every event of the tasks in insertion order (ids). ``occurrence`` is the effect
-- occurrence a ``reconciled`` event resolves (NULL for other kinds).
SELECT id, task_id, kind, worker_id, fencing_token,
       detail ->> 'occurrence' AS occurrence, at, tenant
FROM toolkit_task_events
WHERE task_id = ANY(%(task_ids)s::bigint[])
ORDER BY task_id, id;

-- name: audit_evidence
-- Every effect evidence record of the tasks in insertion order (ids).
SELECT id, task_id, occurrence, step, idempotent, record, worker_id, fencing_token,
       recorded_at, tenant
FROM toolkit_effect_evidence
WHERE task_id = ANY(%(task_ids)s::bigint[])
ORDER BY task_id, id;
