-- Tags, bulk plans and awaited results (issue 16; docs/many-tasks.md).

-- Tags: string key/value pairs on a task, set at submit, by the definition's `tags`, or by a
-- handler with its step's fenced commit. A filter on tags is a containment (`tags @> {...}`)
-- answered by this GIN index; jsonb_path_ops keeps it small (it indexes hashes of key/value
-- paths, enough for @>). Adding a column with a constant default rewrites no row.
ALTER TABLE toolkit_tasks ADD COLUMN tags jsonb NOT NULL DEFAULT '{}'::jsonb;
CREATE INDEX toolkit_tasks_tags ON toolkit_tasks USING gin (tags jsonb_path_ops);

-- A task someone awaits (`toolkit wait`, `Tasks.result`): its ending sends a notification on
-- channel toolkit_task_ended, payload the task id, from whatever statement ended it. Only
-- awaited tasks notify: a NOTIFY serialises its transaction's commit with every other
-- notifying one, a cost the fleet's ordinary commits do not pay.
ALTER TABLE toolkit_tasks ADD COLUMN awaited boolean NOT NULL DEFAULT false;

CREATE FUNCTION toolkit_notify_task_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('toolkit_task_ended', NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER toolkit_tasks_notify_ended
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.awaited
          AND NEW.state IN ('succeeded', 'failed', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION toolkit_notify_task_ended();

-- A bulk plan: the tasks a filter matched when the operator previewed an action, each with
-- the fencing token and state it had then. Applying it acts on a task only if both are still
-- the same (compare-and-set), once per (plan, task): the item's outcome is written in the
-- transaction that acts, so an apply that crashed is finished by running it again.
CREATE TABLE toolkit_bulk_plans (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action       text        NOT NULL CHECK (action IN ('cancel', 'signal', 'reconcile')),
    arguments    jsonb       NOT NULL,
    filter       jsonb       NOT NULL,
    operator     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz
);

-- No foreign key to toolkit_tasks: a task pruned after the plan was made is reported gone.
CREATE TABLE toolkit_bulk_plan_tasks (
    plan_id      bigint      NOT NULL REFERENCES toolkit_bulk_plans (id) ON DELETE CASCADE,
    task_id      bigint      NOT NULL,
    lease_token  bigint      NOT NULL,
    state        text        NOT NULL,
    outcome      text        CHECK (outcome IN ('applied', 'moved', 'gone', 'refused')),
    detail       jsonb,
    applied_at   timestamptz,
    PRIMARY KEY (plan_id, task_id)
);
CREATE INDEX toolkit_bulk_plan_tasks_open ON toolkit_bulk_plan_tasks (plan_id, task_id)
    WHERE outcome IS NULL;
