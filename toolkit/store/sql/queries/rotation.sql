-- fragment: due_in_statement
-- A one-row CTE that an UPDATE making tasks due sooner joins, so that it is evaluated before
-- any task row changes: it says, for the statement's transaction, that the statement keeps
-- the tenant rotation's invariant itself (due_marks). The triggers that kept it before
-- migration 0030, kept for the previous release's workers during an upgrade, then leave it
-- alone. (A row trigger's WHEN is evaluated as each row is updated, so the setting must come
-- first; an INSERT's statement trigger reads it at the statement's end.)
due_in_statement AS (
    SELECT set_config('toolkit.due_in_statement', 'on', true) AS flag
)

-- fragment: due_marks
-- The tenant rotation's invariant (migration 0020; docs/decisions.md "The fair claim at any
-- number of tenants"): a live task due at d, of a tenant not ready, has next_due <= d. Kept
-- by each statement that inserts live tasks or makes tasks due sooner, as the triggers did
-- (no trigger, since a distributed table can have none: issue 25, docs/scaling.md). CTE
-- made_due holds (tenant, at) of the tasks the statement made due sooner, at each one's new
-- due time (run_at, or lease_expires_at for a leased task); a superset is safe (a tenant
-- promoted early is demoted again by the claim that finds it dry).
-- * KEY SHARE on the tenants' rows first, in tenant order, as a foreign key check would
--   take: the demotion locks a tenant's row FOR UPDATE SKIP LOCKED, so it leaves alone a
--   tenant with such a write in flight, and this lock, taken after the demotion's, waits
--   for it to commit. The lock returns each row's latest version.
-- * The UPDATE tests that version's ready, never its own: a row whose snapshot version
--   fails a test of the UPDATE is skipped without being read again, so a demotion that
--   committed while the lock waited would be missed. It lowers next_due on the row as
--   updated.
-- * %(tenant)s, when the statement makes one tenant's tasks due (null: any, a statement
--   over several tenants' tasks), names it beside the CTE's tenants, so that a store
--   distributed by tenant routes both to the tenant's node (docs/scaling.md).
-- A tenant row must be in the statement's snapshot: a task that exists has its tenant's row
-- committed before it, and a submit for a tenant first registers it by a statement of its
-- own when the process has not seen it (register_tenant, toolkit/store/submission.py); a
-- row inserted by the statement itself is ready.
due_at AS (
    SELECT tenant, min(at) AS at FROM made_due GROUP BY tenant
), due_locked AS (
    SELECT tn.tenant, tn.ready, tn.next_due
    FROM toolkit_tenants tn
    WHERE tn.tenant = ANY(ARRAY(SELECT tenant FROM due_at))
      AND (%(tenant)s::text IS NULL OR tn.tenant = %(tenant)s)
    ORDER BY tn.tenant
    FOR KEY SHARE OF tn
), due_marked AS (
    UPDATE toolkit_tenants tn
    SET next_due = least(tn.next_due, d.at)
    FROM due_at d
    WHERE tn.tenant = ANY(ARRAY(SELECT l.tenant FROM due_locked l JOIN due_at a USING (tenant)
                                WHERE NOT l.ready
                                  AND (l.next_due IS NULL OR l.next_due > a.at)))
      AND d.tenant = tn.tenant
      AND (%(tenant)s::text IS NULL OR tn.tenant = %(tenant)s)
)

-- fragment: rotation_floor
-- The lowest vtime of the ready, unpaused tenants (null: none): where a tenant that enters
-- that set (created, promoted, resumed) starts, so that it brings no burst of credit from
-- its time away and nobody behind it waits for it to catch up from zero (migration 0020).
-- The statements that put a tenant in the set read it themselves (no trigger: issue 25);
-- the triggers that did, kept for the previous release's workers, set the same value again.
(SELECT vtime FROM toolkit_tenants WHERE ready AND NOT paused ORDER BY vtime, tenant LIMIT 1)
