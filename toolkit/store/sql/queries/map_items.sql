-- name: start_map_items
-- Starts the child tasks of a page of a distributed map step occurrence %(occurrence)s, once
-- each: an item task is keyed by (parent, occurrence/map_index), so a page listed again
-- after a crash of the parent starts none twice. Fenced: nothing happens unless the parent's
-- fence holds its lease. %(items)s: [{map_index, input, tags, error, concurrency_key,
-- concurrency_limit}]; an item with an error (its input refused) is inserted failed with it,
-- a per-item row like any other, and holds no key. An item task with a concurrency key is
-- admitted or parked (key_admission: lock_keys ran first, in the same transaction). The
-- rotation's marks: due_marks.
WITH
-- include: due_in_statement
,
-- include: keys_in_statement
, parent AS (
    SELECT t.id, t.tenant, t.tags FROM toolkit_tasks t
    WHERE t.id = %(task_id)s
      AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s)
    FOR NO KEY UPDATE
), item AS (
    SELECT *,
           statement_timestamp() + %(timeout)s::float8 * interval '1 second' AS deadline_at,
           CASE WHEN r.error IS NULL THEN 'queued' ELSE 'failed' END AS state,
           NULL::text AS wait_reason, statement_timestamp() AS run_at
    FROM jsonb_to_recordset(%(items)s::jsonb) AS r(
        map_index integer, input jsonb, tags jsonb, error jsonb, concurrency_key text,
        concurrency_limit integer)
), key_rows AS (
    SELECT item.map_index AS n, parent.tenant, %(name)s::text AS definition_name,
           item.concurrency_key, item.concurrency_limit
    FROM item, parent
    WHERE item.concurrency_key IS NOT NULL
),
-- include: key_admission
, inserted AS (
    INSERT INTO toolkit_tasks
        (tenant, definition_name, definition_version, definition_digest, input, checkpoint,
         parent_id, parent_occurrence, map_index, deadline_at, concurrency_key,
         concurrency_limit, priority, trace_parent, key_held, start_after, state,
         wait_reason, run_at, tags, error, finished_at)
    SELECT parent.tenant, %(name)s, %(version)s, %(digest)s,
           coalesce(r.input, 'null'::jsonb),  -- an input too large to keep: null
           %(checkpoint)s::jsonb, parent.id, %(occurrence)s || '/' || r.map_index,
           r.map_index, r.deadline_at,
           r.concurrency_key, r.concurrency_limit, %(priority)s::smallint,
           %(trace_parent)s::text,
           -- include: keyed_start
           ,
           -- The parent's tags (first keys first, as many as the limit leaves room for),
           -- then the item task's own.
           coalesce((SELECT jsonb_object_agg(p.key, p.value)
                     FROM (SELECT key, value FROM jsonb_each(parent.tags)
                           WHERE NOT r.tags ? key
                           ORDER BY key
                           LIMIT greatest(0, %(max_tags)s::int
                                          - (SELECT count(*) FROM jsonb_object_keys(r.tags)))
                          ) p), '{}'::jsonb) || r.tags,
           r.error,
           CASE WHEN r.error IS NOT NULL THEN r.run_at END  -- (the clock read in item)
    FROM parent
    CROSS JOIN item r
    LEFT JOIN key_decided d ON d.n = r.map_index
    CROSS JOIN due_in_statement
    CROSS JOIN keys_in_statement
    ORDER BY r.map_index
    ON CONFLICT (parent_id, parent_occurrence, tenant) WHERE parent_id IS NOT NULL DO NOTHING
    RETURNING id, tenant, state, error, parent_occurrence, run_at, definition_name,
              concurrency_key, wait_reason
), key_parked AS (
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    SELECT tenant, definition_name, concurrency_key FROM inserted
    WHERE wait_reason = 'concurrency'
), made_due AS (
    SELECT tenant, run_at AS at FROM inserted WHERE state IN ('queued', 'leased', 'waiting')
),
-- include: due_marks
, events AS (
    INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
    SELECT id, tenant, 'submitted',
           jsonb_build_object('parent_id', %(task_id)s::bigint, 'occurrence', parent_occurrence)
    FROM inserted
    UNION ALL
    SELECT id, tenant, 'failed', jsonb_build_object('error', error)
    FROM inserted WHERE state = 'failed'
)
SELECT (SELECT id FROM parent) AS parent_id,
       (SELECT count(*) FROM inserted) AS inserted,
       CASE WHEN EXISTS (SELECT 1 FROM inserted) THEN '' END AS notify_toolkit_wakeup;

-- name: map_progress
-- How many child tasks of distributed map occurrence %(occurrence)s of task %(parent_id)s
-- are live, and how many items failed (those of failed or cancelled children: a task's
-- items run from its map_index to the next task's, the last one's to %(listed)s). Reads
-- the live and the failed children only (their partial indexes), not every child.
SELECT (SELECT count(*) FROM toolkit_tasks
        WHERE parent_id = %(parent_id)s AND tenant = %(tenant)s AND map_index IS NOT NULL
          AND state IN ('queued', 'leased', 'waiting')
          AND starts_with(parent_occurrence, %(occurrence)s || '/')) AS live,
       (SELECT coalesce(sum(coalesce(
                   (SELECT min(n.map_index) FROM toolkit_tasks n
                    WHERE n.parent_id = f.parent_id AND n.tenant = %(tenant)s
                      AND n.map_index > f.map_index
                      AND starts_with(n.parent_occurrence, %(occurrence)s || '/')),
                   %(listed)s) - f.map_index), 0)::bigint
        FROM toolkit_tasks f
        WHERE f.parent_id = %(parent_id)s AND f.tenant = %(tenant)s AND f.map_index IS NOT NULL
          AND f.state IN ('failed', 'cancelled')
          AND starts_with(f.parent_occurrence, %(occurrence)s || '/')) AS failed;

-- name: map_summary
-- Where every child task of distributed map occurrence %(occurrence)s of task
-- %(parent_id)s stands, read once the map ends: tasks, live tasks, items succeeded and
-- failed, and the first %(errors)s failed or cancelled tasks in item order.
WITH c AS (
    SELECT id, state, error, map_index,
           coalesce(lead(map_index) OVER (ORDER BY map_index), %(listed)s) - map_index AS items
    FROM toolkit_tasks
    WHERE parent_id = %(parent_id)s AND tenant = %(tenant)s AND map_index IS NOT NULL
      AND starts_with(parent_occurrence, %(occurrence)s || '/')
)
SELECT count(*) AS tasks,
       count(*) FILTER (WHERE state IN ('queued', 'leased', 'waiting')) AS live,
       coalesce(sum(items) FILTER (WHERE state = 'succeeded'), 0)::bigint AS succeeded,
       coalesce(sum(items) FILTER (WHERE state IN ('failed', 'cancelled')), 0)::bigint AS failed,
       coalesce((SELECT jsonb_agg(jsonb_build_object('index', e.map_index, 'items', e.items,
                                                     'task_id', e.id, 'state', e.state,
                                                     'error', e.error) ORDER BY e.map_index)
                 FROM (SELECT * FROM c WHERE state IN ('failed', 'cancelled')
                       ORDER BY map_index LIMIT %(errors)s) e), '[]'::jsonb) AS errors
FROM c;

-- name: cancel_map_items
-- Cancels the live child tasks of distributed map occurrence %(occurrence)s of task
-- %(task_id)s (its failures passed what it tolerates, or its deadline), as `toolkit cancel`
-- would each. Fenced: nothing happens unless the parent's fence holds its lease.
WITH parent AS (
    SELECT t.id FROM toolkit_tasks t
    WHERE t.id = %(task_id)s
      AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s)
), target AS (
    SELECT id, state, lease_expires_at FROM toolkit_tasks
    WHERE parent_id = (SELECT id FROM parent) AND tenant = %(tenant)s AND map_index IS NOT NULL
      AND starts_with(parent_occurrence, %(occurrence)s || '/')
      AND state IN ('queued', 'leased', 'waiting')
    ORDER BY id
    FOR NO KEY UPDATE
),
-- include: cancel_targets
SELECT ARRAY(SELECT id FROM now_cancelled UNION ALL SELECT id FROM requested) AS ids,
       (SELECT wakeup FROM notices) AS notify_toolkit_wakeup,
       (SELECT ended FROM notices) AS notify_toolkit_task_ended;

-- name: map_item_results
-- The child tasks of task %(parent_id)s's distributed map steps, in item order from
-- %(after)s (a map_index), of occurrence %(occurrence)s and state %(state)s when given.
SELECT id, parent_occurrence, map_index, state, input, result, error, finished_at
FROM toolkit_tasks
WHERE parent_id = %(parent_id)s AND tenant = %(tenant)s
  AND map_index IS NOT NULL AND map_index >= %(after)s
  AND (%(occurrence)s::text IS NULL OR starts_with(parent_occurrence, %(occurrence)s || '/'))
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
ORDER BY map_index, id
LIMIT %(limit)s;
