-- Priority (issue 20, docs/flow-control.md#priority): 0 (the default, lowest) to 9. Inside a
-- tenant's share the claim takes due tasks in the order of their claim time: the due time
-- (run_at, or a leased task's lease expiry) minus one minute per priority level. A task of
-- priority p is taken as if it had been due p minutes earlier: ahead of lower ones due up to
-- that much before it, behind those due longer before (the ageing rule: nothing waits more
-- than 9 minutes behind later, higher work).
ALTER TABLE toolkit_tasks
    ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9);

-- The claim index, keyed by claim time (UTC wall time, so that the expression is immutable;
-- at priority 0 it orders exactly as the due time did). Replaces 0002's, under the same name.
DROP INDEX toolkit_tasks_tenant_due;
CREATE INDEX toolkit_tasks_tenant_due
    ON toolkit_tasks (tenant,
                      ((CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                        AT TIME ZONE 'UTC') - priority * interval '1 minute'),
                      id)
    WHERE state IN ('queued', 'leased', 'waiting');

-- The live tasks above priority 0 by due time: an idle worker's next wake-up reads the
-- first of them exactly (its claim time may come before its due time).
CREATE INDEX toolkit_tasks_tenant_priority_due
    ON toolkit_tasks (tenant, (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END))
    WHERE priority > 0 AND state IN ('queued', 'leased', 'waiting');
