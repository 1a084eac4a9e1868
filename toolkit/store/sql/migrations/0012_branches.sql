-- Branch state stored per branch, and branches that wait (issue 18; docs/composition.md).

-- One row per branch of a parallel or map step occurrence in progress: a branch's end
-- writes its own row only, never the task's other branches (a map's cost stays linear in
-- its items). fanout is the step's occurrence ('fan#1'), name the branch's name or a map
-- item's index, position its order. frame is the branch's progress as JSON (the
-- checkpoint's branch frame). A waiting branch (status 'waiting') waits for what
-- waits_for names ('signal:NAME', 'callback:TOKEN', 'child:ID') or until run_at; a
-- signal, completion or child end for it adds one to wakes, and the worker that resumes
-- it records the wakes it saw (seen): wakes > seen is a wake not yet handled, and no wake
-- is lost to a write of the row that raced with it. Rows go when their step ends; rows of
-- a task that ended in the middle of the step stay with it (toolkit show) and go with it.
CREATE TABLE toolkit_branches (
    task_id    bigint      NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    fanout     text        NOT NULL,
    name       text        NOT NULL,
    position   integer     NOT NULL,
    status     text        NOT NULL
        CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled', 'blocked', 'waiting')),
    frame      jsonb       NOT NULL,
    run_at     timestamptz,
    waits_for  text[]      NOT NULL DEFAULT '{}',
    wakes      integer     NOT NULL DEFAULT 0,
    seen       integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, fanout, name)
);
-- What a resumed step reads: its branches that are not ended.
CREATE INDEX toolkit_branches_live ON toolkit_branches (task_id, fanout, position)
    WHERE status IN ('running', 'blocked', 'waiting');
-- The earliest timer of a task's waiting branches (the task's run_at).
CREATE INDEX toolkit_branches_timers ON toolkit_branches (task_id, run_at)
    WHERE status = 'waiting';
-- Waiting branches with a wake not yet handled.
CREATE INDEX toolkit_branches_woken ON toolkit_branches (task_id)
    WHERE status = 'waiting' AND wakes > seen;
-- What a signal, a callback completion or a child's end looks up: who waits for it.
CREATE INDEX toolkit_branches_waits ON toolkit_branches USING gin (waits_for)
    WHERE status = 'waiting';

-- A signal may be addressed to one branch or map item (toolkit signal --branch / --item):
-- only a wait of that branch takes it. NULL: the task as a whole.
ALTER TABLE toolkit_signals ADD COLUMN address text;

-- A task whose live branches all wait waits itself, reason 'branches', holding no lease.
ALTER TABLE toolkit_tasks DROP CONSTRAINT toolkit_tasks_wait_reason_check;
ALTER TABLE toolkit_tasks ADD CONSTRAINT toolkit_tasks_wait_reason_check
    CHECK (wait_reason IN ('timer', 'signal', 'callback', 'child', 'budget', 'limit',
                           'reconciliation', 'start', 'branches'));
