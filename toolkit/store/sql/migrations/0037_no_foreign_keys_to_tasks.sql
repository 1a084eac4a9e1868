-- A task's rows carry no foreign key to their task (issue 22: server CPU per workflow).
--
-- Every row inserted into a table with a foreign key to toolkit_tasks ran PostgreSQL's
-- check of that key: a trigger queued per row and a query of the task's row FOR KEY SHARE,
-- three per one-step workflow (an effect's evidence, two events), one per event or evidence
-- row of every step. Each of these rows is written by a statement that reads its task's row
-- (and locks it when the task's state changes) or under the task's lease. A store
-- distributed by tenant has had none of these keys since it was distributed; the prune
-- deletes a task's rows itself on both layouts (prune_tasks), as it has since issue 25, and
-- the previous release's prune does too (docs/decisions.md, "A task's rows carry no foreign
-- key").
--
-- Run while workers run: dropping a key locks its table and toolkit_tasks, so toolkit_tasks
-- is locked first (the workers' statements read it before they insert a task's rows, and a
-- lock taken in the other order could deadlock with them), and a lock not had within 10 s
-- (behind a long export, say) fails the migration, rolled back whole, rather than hold the
-- fleet's writes queued behind it: run `toolkit db migrate` again. A distributed store has
-- no such key, and nothing here runs there.
DO $$
DECLARE
    r record;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_constraint
               WHERE contype = 'f' AND confrelid = 'toolkit_tasks'::regclass) THEN
        PERFORM set_config('lock_timeout', '10s', true);
        LOCK TABLE toolkit_tasks IN ACCESS EXCLUSIVE MODE;
        FOR r IN
            SELECT conrelid::regclass AS rel, conname
            FROM pg_constraint
            WHERE contype = 'f' AND confrelid = 'toolkit_tasks'::regclass
            ORDER BY conrelid::regclass::text
        LOOP
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.rel, r.conname);
        END LOOP;
    END IF;
END $$;
