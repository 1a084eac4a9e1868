-- The tenant rotation's marks are made by the statements that make tasks due sooner (issue
-- 25, second step, second part; docs/scaling.md): Citus distributes no table with triggers.
-- Every statement of this release that inserts a live task or makes one due sooner keeps
-- the rotation's invariant (migration 0020) itself, with the due_marks fragment
-- (toolkit/store/sql/queries/rotation.sql), and says so for its transaction:
-- set_config('toolkit.due_in_statement', 'on', true), before any task row changes.
--
-- The two triggers that kept it stay for the previous release's workers (the runbook
-- migrates while they still run, docs/operations.md "Deploying a release"); each now leaves
-- alone a transaction that says it keeps the invariant itself. Distributing the tables drops
-- them.
DROP TRIGGER toolkit_tasks_inserted_due ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_inserted_due
    AFTER INSERT ON toolkit_tasks
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    WHEN (current_setting('toolkit.due_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_tasks_inserted_due();

DROP TRIGGER toolkit_tasks_due_sooner ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_due_sooner
    AFTER UPDATE OF state, run_at, lease_expires_at ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.state IN ('queued', 'leased', 'waiting')
          AND (OLD.state NOT IN ('queued', 'leased', 'waiting')
               OR CASE WHEN NEW.state = 'leased' THEN NEW.lease_expires_at ELSE NEW.run_at END
                  < CASE WHEN OLD.state = 'leased' THEN OLD.lease_expires_at
                         ELSE OLD.run_at END)
          AND current_setting('toolkit.due_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_task_due_sooner();

-- The key admission (toolkit_admit_keys, migration 0015) makes parked tasks due: it says
-- that it keeps the invariant itself and, once it admitted tasks, takes KEY SHARE on their
-- tenants' rows (in tenant order) and lowers next_due to now (a lower bound of the admitted
-- tasks' due times) where a tenant is not ready; each of its queries has its own snapshot,
-- taken after the lock. The function is edited in place (its definition as the database
-- holds it), and the migration fails if it is not the one it expects.
DO $$
DECLARE
    body text := pg_get_functiondef('toolkit_admit_keys(integer)'::regprocedure);
    declared text := E'    n integer;\n';
    start text := E'    admitted := 0;\n';
    counted text := E'        admitted := admitted + n;\n';
    finish text := E'    IF admitted > 0 THEN\n';
BEGIN
    IF strpos(body, declared) = 0 OR strpos(body, start) = 0 OR strpos(body, counted) = 0
       OR strpos(body, finish) = 0 THEN
        RAISE EXCEPTION 'toolkit_admit_keys is not the function migration 0030 edits';
    END IF;
    body := replace(body, declared, declared || E'    marked text[] := ''{}'';\n');
    body := replace(body, start, start
        || E'    PERFORM set_config(''toolkit.due_in_statement'', ''on'', true);\n');
    body := replace(body, counted, counted
        || E'        IF n > 0 THEN\n'
        || E'            marked := marked || k.tenant;\n'
        || E'        END IF;\n');
    body := replace(body, finish, finish
        || E'        PERFORM 1 FROM toolkit_tenants WHERE tenant = ANY(marked)\n'
        || E'        ORDER BY tenant FOR KEY SHARE;\n'
        || E'        UPDATE toolkit_tenants SET next_due = least(next_due, statement_timestamp())\n'
        || E'        WHERE tenant = ANY(marked) AND NOT ready;\n');
    EXECUTE body;
END $$;
