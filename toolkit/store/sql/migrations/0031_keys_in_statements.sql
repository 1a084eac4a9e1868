-- A keyed task is admitted or parked by the statement that inserts it (issue 25, second
-- step, last part; docs/scaling.md): Citus distributes no table with triggers. A keyed
-- insert is two statements in one transaction: lock_keys tries the keys' advisory locks,
-- then the insert, in a snapshot taken after them, counts each key's holders and admits
-- or parks its rows (the key_admission fragment, toolkit/store/sql/queries/keys.sql). A
-- redriven keyed task is parked by the redrive, for the admission to take. Both say so for
-- their transaction: set_config('toolkit.keys_in_statement', 'on', true), before any row
-- is written.
--
-- The two triggers that did it stay for the previous release's workers (the runbook
-- migrates while they still run); each now leaves alone a transaction that says it does
-- the work. Distributing the tables drops them.
DROP TRIGGER toolkit_tasks_park_for_key ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_park_for_key
    BEFORE INSERT ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL
          AND current_setting('toolkit.keys_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_park_for_key();

DROP TRIGGER toolkit_tasks_repark_for_key ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_repark_for_key
    BEFORE UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL
          AND OLD.state IN ('succeeded', 'failed', 'cancelled')
          AND NEW.state IN ('queued', 'leased', 'waiting')
          AND current_setting('toolkit.keys_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_park_for_key();
