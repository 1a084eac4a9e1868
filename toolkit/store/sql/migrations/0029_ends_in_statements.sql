-- What a task's end does beyond its row is done by the statement that ends it (issue 25,
-- second step, first part; docs/scaling.md): Citus distributes no table with triggers.
-- The fenced write (commit_fenced) and the cancel (cancel_targets) now release a
-- concurrency key, return reservations, count a scheduled run's outcome and announce an
-- awaited task's end themselves (the task_ended fragment), and say so for their
-- transaction: set_config('toolkit.ends_in_statement', 'on', true).
--
-- The four triggers that did it stay, for the previous release's workers: the runbook
-- migrates while they still run (docs/operations.md, "Deploying a release"), and their
-- statements rely on the triggers. Each trigger now leaves a transaction alone that says it
-- does the work itself, so nothing is done twice. Distributing the tables drops them.
DROP TRIGGER toolkit_tasks_return_reservation ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_return_reservation
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.state IN ('succeeded', 'failed', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled')
          AND jsonb_typeof(NEW.checkpoint #> '{fanout,reserved}') = 'object'
          AND current_setting('toolkit.ends_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_return_reservation();

DROP TRIGGER toolkit_tasks_notify_ended ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_notify_ended
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.awaited
          AND NEW.state IN ('succeeded', 'failed', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled')
          AND current_setting('toolkit.ends_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_notify_task_ended();

DROP TRIGGER toolkit_tasks_count_schedule_outcome ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_count_schedule_outcome
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.schedule_name IS NOT NULL
          AND NEW.state IN ('succeeded', 'failed')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled')
          AND current_setting('toolkit.ends_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_count_schedule_outcome();

DROP TRIGGER toolkit_tasks_release_key ON toolkit_tasks;
CREATE TRIGGER toolkit_tasks_release_key
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.key_held
          AND NEW.state IN ('succeeded', 'failed', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled')
          AND current_setting('toolkit.ends_in_statement', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION toolkit_release_key();
