-- Distributed map steps (issue 22, docs/composition.md#distributed-map): a map step with
-- `distributed: true` runs its items as child tasks across the fleet.
--
-- map_index: the index of the first item a child task of a distributed map runs (null for
-- every other task). Such a child does not wake its parent when it ends: 20,000 children
-- would wake it 20,000 times, and lock its row as many. The parent waits with reason 'map'
-- and counts its live and its failed children at intervals (map_progress), through the
-- partial indexes below: a count reads those, not every child.
ALTER TABLE toolkit_tasks ADD COLUMN map_index integer CHECK (map_index >= 0);

-- A map's children by parent, in item order: its summary counts them, the per-item
-- results read them (partial: only distributed maps' children are in it).
CREATE INDEX toolkit_tasks_map_items
    ON toolkit_tasks (parent_id, map_index)
    WHERE map_index IS NOT NULL;
CREATE INDEX toolkit_tasks_map_live
    ON toolkit_tasks (parent_id)
    WHERE map_index IS NOT NULL AND state IN ('queued', 'leased', 'waiting');
CREATE INDEX toolkit_tasks_map_failed
    ON toolkit_tasks (parent_id, map_index)
    WHERE map_index IS NOT NULL AND state IN ('failed', 'cancelled');

ALTER TABLE toolkit_tasks DROP CONSTRAINT toolkit_tasks_wait_reason_check;
ALTER TABLE toolkit_tasks ADD CONSTRAINT toolkit_tasks_wait_reason_check
    CHECK (wait_reason IN ('timer', 'signal', 'callback', 'child', 'budget', 'limit',
                           'reconciliation', 'start', 'branches', 'concurrency', 'debounce',
                           'map'));

-- The tasks whose distributed map counts its children: `toolkit run --until-idle` waits for
-- one whose children all ended (idle_state), without reading any parked task.
CREATE INDEX toolkit_tasks_map_waits
    ON toolkit_tasks (definition_digest)
    WHERE state = 'waiting' AND wait_reason = 'map';
