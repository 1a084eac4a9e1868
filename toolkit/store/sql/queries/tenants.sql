-- name: set_tenant
-- Creates or updates a tenant's admission settings and budget amounts in one statement.
-- A setting given as NULL keeps its value (%(set_max_active)s: whether max_active is given;
-- NULL then means "no limit"); a new tenant starts from the defaults. Budgets: for each
-- resource of %(resources)s, the amount of %(amounts)s at the same position is set (used is
-- kept), or the budget is removed when that amount is NULL. Wakes idle workers: a resumed
-- tenant or a raised limit may have made tasks claimable. A new or resumed tenant joins the
-- rotation at its floor (rotation_floor).
WITH tenant AS (
    -- (INSERT ... SELECT: Citus takes a sub-select there, not in VALUES)
    INSERT INTO toolkit_tenants AS tn (tenant, max_active, weight, paused, vtime)
    SELECT %(tenant)s, %(max_active)s::integer, coalesce(%(weight)s::integer, 1),
           coalesce(%(paused)s::boolean, false),
           coalesce(
               -- include: rotation_floor
               , 0)
    ON CONFLICT (tenant) DO UPDATE
    SET max_active = CASE WHEN %(set_max_active)s::boolean THEN excluded.max_active
                          ELSE tn.max_active END,
        weight = coalesce(%(weight)s::integer, tn.weight),
        paused = coalesce(%(paused)s::boolean, tn.paused),
        vtime = CASE WHEN tn.paused AND tn.ready AND NOT coalesce(%(paused)s::boolean, true)
                     THEN greatest(tn.vtime, excluded.vtime) ELSE tn.vtime END,
        updated_at = excluded.updated_at
    RETURNING tn.tenant
), budget AS (
    SELECT b.resource, b.amount
    FROM unnest(%(resources)s::text[], %(amounts)s::numeric[]) AS b(resource, amount)
), budget_set AS (
    INSERT INTO toolkit_tenant_budgets AS tb (tenant, resource, amount)
    SELECT tenant.tenant, budget.resource, budget.amount
    FROM tenant, budget
    WHERE budget.amount IS NOT NULL
    ON CONFLICT (tenant, resource) DO UPDATE SET amount = excluded.amount
), budget_cleared AS (
    DELETE FROM toolkit_tenant_budgets tb
    USING budget
    WHERE tb.tenant = %(tenant)s AND tb.resource = budget.resource AND budget.amount IS NULL
)
SELECT tenant, ''::text AS notify_toolkit_wakeup FROM tenant;

-- name: list_tenants
-- Every tenant (or the one named by %(tenant)s) with its settings, its live task counts
-- (leased: every leased task; active: those whose lease has not expired, what max_active
-- bounds) and its budgets (amount; used: spent plus reserved; reserved), by tenant name.
SELECT tn.tenant, tn.max_active, tn.weight, tn.paused, tn.created_at, tn.updated_at,
       counts.queued, counts.leased, counts.active, counts.waiting,
       coalesce(budgets.resources, '{}') AS budget_resources,
       coalesce(budgets.amounts, '{}') AS budget_amounts,
       coalesce(budgets.used, '{}') AS budget_used,
       coalesce(budgets.reserved, '{}') AS budget_reserved
FROM toolkit_tenants tn
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE state = 'queued') AS queued,
           count(*) FILTER (WHERE state = 'leased') AS leased,
           count(*) FILTER (WHERE state = 'leased' AND lease_expires_at > statement_timestamp())
               AS active,
           count(*) FILTER (WHERE state = 'waiting') AS waiting
    FROM toolkit_tasks
    WHERE tenant = tn.tenant AND state IN ('queued', 'leased', 'waiting')
) counts
LEFT JOIN LATERAL (
    SELECT array_agg(resource ORDER BY resource) AS resources,
           array_agg(amount ORDER BY resource) AS amounts,
           array_agg(used ORDER BY resource) AS used,
           array_agg(reserved ORDER BY resource) AS reserved
    FROM toolkit_tenant_budgets
    WHERE tenant = tn.tenant
) budgets ON true
WHERE %(tenant)s::text IS NULL OR tn.tenant = %(tenant)s
ORDER BY tn.tenant;

-- name: register_tenant
-- Registers a tenant (default settings) if it is new, by a statement of its own before the
-- first statement that inserts its tasks: that statement's rotation marks (due_marks) need
-- the tenant's row in their snapshot, and a row another transaction commits meanwhile would
-- not be (Tasks.submit; toolkit/store/submission.py register_tenant).
-- A new tenant joins the rotation at its floor (rotation_floor). (INSERT ... SELECT: Citus
-- takes a sub-select there, not in VALUES.)
INSERT INTO toolkit_tenants (tenant, vtime)
SELECT %(tenant)s,
       coalesce(
           -- include: rotation_floor
           , 0)
ON CONFLICT DO NOTHING;
