-- runifold store, schema version 3: child workflows and budget spend (DESIGN §2-3).

-- A child task knows its parent and the parent's step occurrence that started it: at most one
-- child per occurrence, so starting a child is idempotent across crashes of the parent.
ALTER TABLE toolkit_tasks
    ADD COLUMN parent_id bigint,
    ADD COLUMN parent_occurrence text,
    -- Set on a parent when one of its children ends while the parent still holds its lease:
    -- the parent's next wait for a child is then due at once (no wake-up is lost).
    ADD COLUMN child_wake boolean NOT NULL DEFAULT false;
CREATE UNIQUE INDEX toolkit_tasks_child ON toolkit_tasks (parent_id, parent_occurrence)
    WHERE parent_id IS NOT NULL;

-- What an effect reported spending (ctx.spend), recorded with its evidence under the fence.
ALTER TABLE toolkit_effect_evidence ADD COLUMN spend jsonb;
