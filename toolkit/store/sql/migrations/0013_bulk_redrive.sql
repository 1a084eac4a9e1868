-- Bulk redrive (issue 19; docs/many-tasks.md): a bulk plan may redrive the failed and
-- cancelled tasks a filter matches. Each task is redriven in a transaction of its own that
-- also records its plan item's outcome (a redrive reads the task's evidence, events and
-- branches to plan it, as `toolkit redrive` does one).
ALTER TABLE toolkit_bulk_plans DROP CONSTRAINT toolkit_bulk_plans_action_check;
ALTER TABLE toolkit_bulk_plans ADD CONSTRAINT toolkit_bulk_plans_action_check
    CHECK (action IN ('cancel', 'signal', 'reconcile', 'redrive'));
