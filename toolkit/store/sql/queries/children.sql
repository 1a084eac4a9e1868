-- name: start_child
-- Starts the child task of a parent's step occurrence, once: a second call for the same
-- (parent, occurrence), after a crash of the parent, finds the child already there. Fenced:
-- nothing happens unless the parent's fence (%(task_id)s is the parent) holds its lease.
-- A child with a concurrency key is admitted or parked (key_admission: lock_keys ran
-- first, in the same transaction). The rotation's marks: due_marks.
WITH
-- include: due_in_statement
,
-- include: keys_in_statement
, parent AS (
    SELECT t.id, t.tenant, t.tags FROM toolkit_tasks t
    WHERE t.id = %(task_id)s
      AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s)
    FOR NO KEY UPDATE
), r AS (
    SELECT 1 AS n,
           statement_timestamp() + %(timeout)s::float8 * interval '1 second' AS deadline_at,
           'queued' AS state, NULL::text AS wait_reason, statement_timestamp() AS run_at
), key_rows AS (
    SELECT 1 AS n, parent.tenant, %(name)s::text AS definition_name,
           %(concurrency_key)s::text AS concurrency_key,
           %(concurrency_limit)s::int AS concurrency_limit
    FROM parent
    WHERE %(concurrency_key)s::text IS NOT NULL
),
-- include: key_admission
, inserted AS (
    INSERT INTO toolkit_tasks
        (tenant, definition_name, definition_version, definition_digest, input, checkpoint,
         parent_id, parent_occurrence, deadline_at, concurrency_key, concurrency_limit,
         priority, trace_parent, key_held, start_after, state, wait_reason, run_at, tags)
    SELECT parent.tenant, %(name)s, %(version)s, %(digest)s, %(input)s::jsonb,
           %(checkpoint)s::jsonb, parent.id, %(occurrence)s, r.deadline_at,
           %(concurrency_key)s::text, %(concurrency_limit)s::int, %(priority)s::smallint,
           %(trace_parent)s::text,
           -- include: keyed_start
           ,
           -- The parent's tags (first keys first, as many as the limit leaves room for),
           -- then the child's own.
           coalesce((SELECT jsonb_object_agg(p.key, p.value)
                     FROM (SELECT key, value FROM jsonb_each(parent.tags)
                           WHERE NOT %(tags)s::jsonb ? key
                           ORDER BY key
                           LIMIT greatest(0, %(max_tags)s::int
                                          - (SELECT count(*) FROM jsonb_object_keys(%(tags)s::jsonb)))
                          ) p), '{}'::jsonb) || %(tags)s::jsonb
    FROM parent
    CROSS JOIN r
    LEFT JOIN key_decided d ON d.n = r.n
    CROSS JOIN due_in_statement
    CROSS JOIN keys_in_statement
    ON CONFLICT (parent_id, parent_occurrence, tenant) WHERE parent_id IS NOT NULL DO NOTHING
    RETURNING id, tenant, run_at, definition_name, concurrency_key, wait_reason
), key_parked AS (
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    SELECT tenant, definition_name, concurrency_key FROM inserted
    WHERE wait_reason = 'concurrency'
), events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
    SELECT id, tenant, 'submitted',
           jsonb_build_object('parent_id', %(task_id)s::bigint, 'occurrence', %(occurrence)s::text)
    FROM inserted
), made_due AS (
    SELECT tenant, run_at AS at FROM inserted
),
-- include: due_marks

SELECT (SELECT id FROM parent) AS parent_id,
       (SELECT id FROM inserted) AS inserted_id,
       CASE WHEN EXISTS (SELECT 1 FROM inserted) THEN '' END AS notify_toolkit_wakeup;

-- name: get_child
-- The child task a parent's step occurrence started, if any.
SELECT id, definition_name, definition_version, state, result, error
FROM toolkit_tasks
WHERE parent_id = %(parent_id)s AND parent_occurrence = %(occurrence)s
  AND tenant = %(tenant)s;

-- name: live_children
-- Every live descendant of tasks %(task_ids)s (children, their children ...), for cancelling
-- parents; root: the task of %(task_ids)s it descends from. %(tenant)s: their tenant (a
-- child has its parent's), or null for tasks of several.
WITH RECURSIVE tree AS (
    SELECT id, parent_id AS root FROM toolkit_tasks p
    WHERE parent_id = ANY(%(task_ids)s::bigint[]) AND (%(tenant)s::text IS NULL OR p.tenant = %(tenant)s)
      AND state IN ('queued', 'leased', 'waiting')
    UNION
    SELECT c.id, tree.root FROM toolkit_tasks c JOIN tree ON c.parent_id = tree.id
    WHERE (%(tenant)s::text IS NULL OR c.tenant = %(tenant)s) AND c.state IN ('queued', 'leased', 'waiting')
)
SELECT id, root FROM tree ORDER BY id;
