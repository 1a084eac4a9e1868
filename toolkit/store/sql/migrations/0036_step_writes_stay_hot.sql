-- A step's write that keeps its lease is a HOT update (issue 22: server CPU per step).
--
-- PostgreSQL updates a row in place (HOT: no new entry in any index) only when no column an
-- index reads has changed. toolkit_tasks_limit_waits indexed an expression of the
-- checkpoint, and every step writes the checkpoint, so every step's write entered its row in
-- every index whose predicate it met: seven for a leased task, the tags' GIN among them. The
-- limit a task waits for is now a stored column generated from the checkpoint, which the
-- index reads instead: PostgreSQL computes it on every update, the previous release's
-- writes included, and a step that keeps its lease leaves it null. The statements that
-- look for a limit's waiting tasks read the column (docs/decisions.md, "A step's write
-- stays in place"). A fill factor of 90 leaves room on each new page for the next version
-- of its rows. Adding the column rewrites the table once.
ALTER TABLE toolkit_tasks
    ADD COLUMN wait_limit text GENERATED ALWAYS AS (checkpoint -> 'wait' ->> 'limit') STORED;
DROP INDEX toolkit_tasks_limit_waits;
CREATE INDEX toolkit_tasks_limit_waits ON toolkit_tasks (wait_limit, run_at)
    WHERE state = 'waiting' AND wait_reason = 'limit';
ALTER TABLE toolkit_tasks SET (fillfactor = 90);
