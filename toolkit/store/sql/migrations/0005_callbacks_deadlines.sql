-- runifold store, schema version 5: callbacks and workflow deadlines.

-- A callback token handed out by an effect with `callback`: one per step occurrence and
-- attempt. `toolkit complete TOKEN` completes it once; a token of an attempt that timed out
-- or was replaced is expired and refused.
CREATE TABLE toolkit_callbacks (
    token         text        PRIMARY KEY,
    task_id       bigint      NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    occurrence    text        NOT NULL,
    attempt       integer     NOT NULL,
    state         text        NOT NULL DEFAULT 'open'
        CHECK (state IN ('open', 'completed', 'expired')),
    result        jsonb,
    error         jsonb,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at  timestamptz
);
CREATE INDEX toolkit_callbacks_task ON toolkit_callbacks (task_id, occurrence);

-- The workflow deadline (definition `timeout`, or a submit's override), database time. A
-- waiting task is due at its deadline at the latest (commit_fenced).
ALTER TABLE toolkit_tasks ADD COLUMN deadline_at timestamptz;
