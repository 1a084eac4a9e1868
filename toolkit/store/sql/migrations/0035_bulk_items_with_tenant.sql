-- A bulk plan's items carry their task's tenant (issue 25; docs/scaling.md). A bulk action
-- locks its batch's items, acts on their tasks and marks the items in one statement; on a
-- store distributed by tenant that statement runs on one shard only if the items live
-- beside their tasks, so toolkit_bulk_plan_tasks is distributed by tenant like the other
-- per-task tables (the plans themselves stay a reference table), and each batch is applied
-- tenant by tenant. The unique key with the tenant last answers the old key's lookups; the
-- distribution makes it the primary key.
-- An item whose task is gone (pruned since) gets the empty tenant, which no task has: it
-- stays reported gone.
ALTER TABLE toolkit_bulk_plan_tasks ADD COLUMN tenant text;
UPDATE toolkit_bulk_plan_tasks i SET tenant = t.tenant FROM toolkit_tasks t WHERE t.id = i.task_id;
UPDATE toolkit_bulk_plan_tasks SET tenant = '' WHERE tenant IS NULL;
ALTER TABLE toolkit_bulk_plan_tasks ALTER COLUMN tenant SET NOT NULL;
CREATE UNIQUE INDEX toolkit_bulk_plan_tasks_tenant
    ON toolkit_bulk_plan_tasks (plan_id, task_id, tenant);

-- The previous release's plans, made while it still runs during an upgrade, do not name
-- the tenant: their items get their task's here. The distribution drops this trigger with
-- the others.
CREATE FUNCTION toolkit_bulk_item_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.tenant := coalesce((SELECT t.tenant FROM toolkit_tasks t WHERE t.id = NEW.task_id), '');
    RETURN NEW;
END $$;

CREATE TRIGGER toolkit_bulk_plan_tasks_tenant
    BEFORE INSERT ON toolkit_bulk_plan_tasks
    FOR EACH ROW WHEN (NEW.tenant IS NULL)
    EXECUTE FUNCTION toolkit_bulk_item_tenant();
