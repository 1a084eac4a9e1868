-- name: lock_keys
-- The first statement of a transaction that inserts tasks with concurrency keys (migration
-- 0031; docs/flow-control.md): tries, never waiting, the advisory lock of each key of
-- %(tenants)s, %(names)s, %(keys)s (one key per position, in the order of the rows to
-- insert), held to commit, as the admission (toolkit_admit_keys) takes it. A transaction
-- tries at most 32 keys so: the count is the setting key_locks (prefix toolkit). Returns
-- the keys it holds. The insert that follows (key_admission), in a snapshot taken after
-- these locks, counts what every holder of a key committed before it.
WITH asked AS (
    SELECT tenant, name, key, min(n) AS first
    FROM unnest(%(tenants)s::text[], %(names)s::text[], %(keys)s::text[])
         WITH ORDINALITY AS k(tenant, name, key, n)
    GROUP BY tenant, name, key
), budget AS (
    SELECT coalesce(nullif(current_setting('toolkit.key_locks', true), ''), '0')::int AS tried
), tried AS (
    SELECT a.tenant, a.name, a.key,
           pg_try_advisory_xact_lock(hashtextextended(
               a.tenant || chr(31) || a.name || chr(31) || a.key, 20)) AS held
    FROM (SELECT * FROM asked
          ORDER BY first
          LIMIT greatest(32 - (SELECT tried FROM budget), 0)) a
), counted AS (
    SELECT set_config('toolkit.key_locks',
                      ((SELECT tried FROM budget) + count(*) FILTER (WHERE held))::text,
                      true) AS tried
    FROM tried
)
SELECT t.tenant, t.name, t.key
FROM tried t, counted
WHERE t.held;

-- fragment: keys_in_statement
-- A one-row CTE that an insert of keyed tasks joins, so that it is evaluated before any
-- row is inserted: it says, for the statement's transaction, that the statement admits or
-- parks each keyed row itself (key_admission). The triggers that did it before migration
-- 0031, kept for the previous release's workers during an upgrade, then leave it alone.
keys_in_statement AS (
    SELECT set_config('toolkit.keys_in_statement', 'on', true) AS flag
)

-- fragment: key_admission
-- Whether each keyed row of an insert is admitted (it holds its key from now on) or
-- parked (waiting, reason concurrency, with a wake row for the admission), as
-- docs/flow-control.md says: CTE key_rows holds (n, tenant, definition_name,
-- concurrency_key, concurrency_limit) of the rows to insert that carry a key, n their
-- order. A key is free when this transaction holds its advisory lock (%(locked_tenants)s,
-- %(locked_names)s, %(locked_keys)s: what lock_keys returned, in an earlier statement, so
-- that this snapshot has every holder committed before the lock) and no task waits for
-- it; then its first rows, in order, are admitted while the key's live holders and the rows
-- before them number fewer than the row's max_active. Every other keyed row is parked.
-- key_decided: (n, admitted, parked). %(tenant)s: the rows' tenant, named for a store
-- distributed by tenant to route the counts (as due_marks; null: several tenants).
key_counts AS (
    SELECT k.tenant, k.definition_name, k.concurrency_key,
           k.locked AND NOT EXISTS (
               SELECT 1 FROM toolkit_tasks w
               WHERE w.tenant = k.tenant AND (%(tenant)s::text IS NULL OR w.tenant = %(tenant)s)
                 AND w.definition_name = k.definition_name
                 AND w.concurrency_key = k.concurrency_key
                 AND w.state = 'waiting' AND w.wait_reason = 'concurrency') AS free,
           CASE WHEN k.locked THEN (
               SELECT count(*) FROM toolkit_tasks h
               WHERE h.tenant = k.tenant AND (%(tenant)s::text IS NULL OR h.tenant = %(tenant)s)
                 AND h.definition_name = k.definition_name
                 AND h.concurrency_key = k.concurrency_key
                 AND h.key_held AND h.state IN ('queued', 'leased', 'waiting')) END AS held
    FROM (
        SELECT DISTINCT r.tenant, r.definition_name, r.concurrency_key,
               EXISTS (SELECT 1
                       FROM unnest(%(locked_tenants)s::text[], %(locked_names)s::text[],
                                   %(locked_keys)s::text[]) AS l(tenant, name, key)
                       WHERE l.tenant = r.tenant AND l.name = r.definition_name
                         AND l.key = r.concurrency_key) AS locked
        FROM key_rows r
    ) k
), key_decided AS (
    SELECT d.n, d.admitted, NOT d.admitted AS parked
    FROM (
        SELECT r.n,
               coalesce(c.free AND c.held + row_number() OVER (
                            PARTITION BY r.tenant, r.definition_name, r.concurrency_key
                            ORDER BY r.n) <= r.concurrency_limit, false) AS admitted
        FROM key_rows r
        JOIN key_counts c USING (tenant, definition_name, concurrency_key)
    ) d
)

-- fragment: keyed_start
-- The last five columns of an inserted task: key_held, start_after, state, wait_reason and
-- run_at, from row r (its state, wait_reason, run_at and deadline_at as it would start
-- without a key) and its decision d (key_decided, null for a row without a key). A parked
-- row waits for its key, never due but at its workflow deadline (it then times out
-- unadmitted), its delayed start kept aside.
coalesce(d.admitted, false),
CASE WHEN d.parked AND r.state = 'waiting' AND r.wait_reason = 'start' THEN r.run_at END,
CASE WHEN d.parked THEN 'waiting' ELSE r.state END,
CASE WHEN d.parked THEN 'concurrency' ELSE r.wait_reason END,
CASE WHEN d.parked THEN least('9999-12-31T00:00:00+00:00'::timestamptz, r.deadline_at)
     ELSE r.run_at END

-- name: key_wake_window
-- The admission on a store distributed by tenant (docs/scaling.md), first of its statements:
-- up to %(max_keys)s keys with wake rows, in key order, read without a lock across shards;
-- each is then admitted by a transaction of its own (try_key_lock, admit_tenant_key).
SELECT DISTINCT tenant, definition_name, concurrency_key
FROM toolkit_key_wakes
ORDER BY tenant, definition_name, concurrency_key
LIMIT %(max_keys)s;

-- name: key_wakes_left
-- Whether any key still has wake rows (the next claim admits again when so).
SELECT EXISTS (SELECT 1 FROM toolkit_key_wakes) AS remaining;

-- name: try_key_lock
-- The advisory lock of key %(key)s of definition %(name)s of tenant %(tenant)s, tried
-- without waiting and held to commit, as lock_keys and toolkit_admit_keys take it: a
-- statement that reads no table, so a Citus coordinator runs it itself, where every
-- other taker of the lock runs too. Returns whether it is held.
SELECT pg_try_advisory_xact_lock(hashtextextended(
    %(tenant)s || chr(31) || %(name)s || chr(31) || %(key)s, 20)) AS held;

-- name: admit_tenant_key
-- toolkit_admit_keys (migration 0015) for one key, key %(key)s of definition %(name)s of
-- tenant %(tenant)s, as one statement routed to the tenant's shard: a store distributed by
-- tenant admits key by key (toolkit/store/distributed_leases.py), each in a transaction
-- whose first statement took the key's lock (try_key_lock), so this statement's snapshot
-- holds what every other holder of the lock committed. It deletes the key's wake rows (a
-- holder that ends after the snapshot leaves one for the next admission), counts the
-- key's live holders, and admits its oldest parked tasks up to the max_active the oldest
-- was submitted with: queued now, or waiting for a delayed start; the tenant's next_due is
-- lowered for them (due_marks). Values that read the clock are made in a CTE (Citus
-- refuses them in the UPDATE's CASE). Returns one row per task admitted, with the key's
-- holders before it; their events are the transaction's next statement
-- (record_key_admissions).
WITH clock AS (
    SELECT statement_timestamp() AS now_at
), woken AS (
    DELETE FROM toolkit_key_wakes
    WHERE tenant = %(tenant)s AND definition_name = %(name)s AND concurrency_key = %(key)s
), held AS (
    SELECT count(*) AS holders
    FROM toolkit_tasks
    WHERE tenant = %(tenant)s AND definition_name = %(name)s AND concurrency_key = %(key)s
      AND key_held AND state IN ('queued', 'leased', 'waiting')
), oldest AS (
    SELECT concurrency_limit
    FROM toolkit_tasks
    WHERE tenant = %(tenant)s AND definition_name = %(name)s AND concurrency_key = %(key)s
      AND state = 'waiting' AND wait_reason = 'concurrency'
    ORDER BY id
    LIMIT 1
), next AS (
    SELECT id
    FROM toolkit_tasks
    WHERE tenant = %(tenant)s AND definition_name = %(name)s AND concurrency_key = %(key)s
      AND state = 'waiting' AND wait_reason = 'concurrency'
    ORDER BY id
    LIMIT greatest((SELECT concurrency_limit FROM oldest) - (SELECT holders FROM held), 0)
    FOR UPDATE
),
-- include: due_in_statement
, taken AS (
    UPDATE toolkit_tasks t
    SET state = CASE WHEN t.start_after > c.now_at THEN 'waiting' ELSE 'queued' END,
        wait_reason = CASE WHEN t.start_after > c.now_at THEN 'start' END,
        run_at = least(greatest(t.start_after, c.now_at), coalesce(t.deadline_at, 'infinity')),
        start_after = NULL,
        key_held = true,
        updated_at = c.now_at
    FROM next, clock c, due_in_statement
    WHERE t.id = next.id AND t.tenant = %(tenant)s
      AND t.state = 'waiting' AND t.wait_reason = 'concurrency'
    RETURNING t.id, t.tenant, t.run_at AS at, t.concurrency_key, t.concurrency_limit
), made_due AS (
    SELECT tenant, at FROM taken
),
-- include: due_marks
SELECT t.id, t.concurrency_key, t.concurrency_limit, h.holders,
       ''::text AS notify_toolkit_wakeup
FROM taken t, held h
ORDER BY t.id;

-- name: record_key_admissions
-- The key_admitted events of the tasks admit_tenant_key admitted for tenant %(tenant)s, a
-- statement of its own in the same transaction (Citus routes no statement that inserts in
-- a CTE to one shard): tasks %(ids)s, each with its %(keys)s, %(limits)s and the key's
-- %(holders)s before the admission.
INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
SELECT a.id, %(tenant)s, 'key_admitted',
       jsonb_build_object('key', a.key, 'max_active', a.max_active, 'holders', a.holders)
FROM unnest(%(ids)s::bigint[], %(keys)s::text[], %(limits)s::integer[], %(holders)s::bigint[])
     AS a(id, key, max_active, holders);
