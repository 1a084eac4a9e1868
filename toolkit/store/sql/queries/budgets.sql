-- name: lock_leased_task
-- Locks a task while its fence's lease holds (toolkit_lease_held); no row otherwise. Also
-- returns the id of the last write applied (checkpoint ->> 'write'), so that a write sent
-- again after a lost connection is found applied.
SELECT t.id, t.checkpoint ->> 'write' AS last_write
FROM toolkit_tasks t
WHERE t.id = %(task_id)s
  AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s)
FOR NO KEY UPDATE;

-- name: lock_tenant_budgets
-- The tenant's budget rows for these resources, locked in resource order (every writer of
-- budget rows locks them after the task row and in this order, so none deadlock).
SELECT resource, amount::float8 AS amount, used::float8 AS used,
       reserved::float8 AS reserved
FROM toolkit_tenant_budgets
WHERE tenant = %(tenant)s AND resource = ANY(%(resources)s::text[])
ORDER BY resource
FOR NO KEY UPDATE;

-- name: take_tenant_budgets
-- Adds a reservation to the tenant's budget use and its reserved part (rows locked by
-- lock_tenant_budgets).
UPDATE toolkit_tenant_budgets b
SET used = b.used + r.value::numeric,
    reserved = b.reserved + r.value::numeric
FROM jsonb_each_text(%(amounts)s::jsonb) AS r
WHERE b.tenant = %(tenant)s AND b.resource = r.key;

-- name: write_reservation
-- Stores the checkpoint that records a reservation, with its write id, and its event; fenced
-- again, though the row is locked: a lease that expired since the lock refuses the write
-- (no row: the transaction is rolled back, nothing is reserved).
WITH updated AS (
    UPDATE toolkit_tasks t
    SET checkpoint = %(checkpoint)s::jsonb || jsonb_build_object('write', %(write_id)s::text),
        updated_at = statement_timestamp()
    WHERE t.id = %(task_id)s
      AND toolkit_lease_held(t, %(worker_id)s, %(tenant)s, %(token)s)
    RETURNING t.id, t.tenant
)
INSERT INTO toolkit_task_events (task_id, tenant, kind, worker_id, fencing_token, detail)
SELECT id, tenant, 'budget_reserved', %(worker_id)s, %(token)s, %(detail)s::jsonb FROM updated
RETURNING task_id;

-- name: tenant_budget_amounts
-- A tenant's budget amounts by resource (what a submit's budget override must fit in).
SELECT resource, amount::float8 AS amount
FROM toolkit_tenant_budgets
WHERE tenant = %(tenant)s;
