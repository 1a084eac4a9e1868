-- Every unique key that an insert names as its ON CONFLICT target includes the tenant
-- (issue 25, first item of "What remains"; docs/scaling.md). Citus keeps a unique index on a
-- distributed table only when it includes the distribution column, and takes an
-- ON CONFLICT target only when it names such an index: the statements of this release name
-- these, the tenant last so that each also answers the lookups of the key it repeats.
--
-- A task's rows carry its task's tenant (migration 0026) and a child its parent's, so each
-- index holds exactly what the older one beside it holds. The older ones stay for the
-- previous release's workers (the runbook migrates while they still run), whose inserts
-- name them; a later release drops them.
--
-- Rows a release before 0026 wrote while 0026 was applied may still lack their tenant:
-- they get it here, or a conflict with one of them would be raised by the older index, which
-- the new target does not name, instead of being resolved.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['toolkit_signals', 'toolkit_callbacks', 'toolkit_limit_slots',
                                'toolkit_branches']
    LOOP
        EXECUTE format('UPDATE %I x SET tenant = t.tenant FROM toolkit_tasks t '
                       'WHERE t.id = x.task_id AND x.tenant IS NULL', name);
    END LOOP;
END $$;

-- A child of a parent's step occurrence, once (was toolkit_tasks_child, migration 0003).
CREATE UNIQUE INDEX toolkit_tasks_child_of_tenant
    ON toolkit_tasks (parent_id, parent_occurrence, tenant) WHERE parent_id IS NOT NULL;
-- An event delivered as a signal, once per task (was toolkit_signals_event, migration 0014).
CREATE UNIQUE INDEX toolkit_signals_event_of_tenant
    ON toolkit_signals (task_id, event_id, tenant) WHERE event_id IS NOT NULL;
-- A callback's token (was the primary key, migration 0005).
CREATE UNIQUE INDEX toolkit_callbacks_token_of_tenant ON toolkit_callbacks (token, tenant);
-- A limit's slot of a step occurrence (was the primary key, migration 0004).
CREATE UNIQUE INDEX toolkit_limit_slots_of_tenant
    ON toolkit_limit_slots (task_id, occurrence, name, tenant);
-- A fan-out's branch (was the primary key, migration 0012).
CREATE UNIQUE INDEX toolkit_branches_of_tenant ON toolkit_branches (task_id, fanout, name, tenant);
