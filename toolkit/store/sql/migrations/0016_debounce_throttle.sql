-- Debounce and throttle of submissions (issue 20, docs/flow-control.md).

-- A debounced task waits (reason 'debounce') until its key has been quiet; a later submit of
-- the key replaces its input while it waits. One such task per key: the submit's
-- INSERT ... ON CONFLICT finds it through this index, and a claimed one has left it.
ALTER TABLE toolkit_tasks ADD COLUMN debounce_key text;
CREATE UNIQUE INDEX toolkit_tasks_debouncing
    ON toolkit_tasks (tenant, definition_name, debounce_key)
    WHERE state = 'waiting' AND wait_reason = 'debounce';

ALTER TABLE toolkit_tasks DROP CONSTRAINT toolkit_tasks_wait_reason_check;
ALTER TABLE toolkit_tasks ADD CONSTRAINT toolkit_tasks_wait_reason_check
    CHECK (wait_reason IN ('timer', 'signal', 'callback', 'child', 'budget', 'limit',
                           'reconciliation', 'start', 'branches', 'concurrency', 'debounce'));

-- A throttle's state per key: the theoretical arrival time of the next start (GCRA). A
-- submit takes a start by moving it on; the row of a key idle for a period says nothing
-- more than a missing row, and may be deleted.
CREATE TABLE toolkit_throttle_keys (
    tenant          text        NOT NULL,
    definition_name text        NOT NULL,
    throttle_key    text        NOT NULL,
    next_at         timestamptz NOT NULL,
    PRIMARY KEY (tenant, definition_name, throttle_key)
);
