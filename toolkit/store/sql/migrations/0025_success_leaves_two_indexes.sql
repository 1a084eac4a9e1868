-- A task that succeeds is no longer entered in toolkit_tasks_definition and
-- toolkit_tasks_state (issue 22: CPU per workflow).
--
-- Every change of state is a non-HOT update, and a non-HOT update enters the new row
-- version in every index whose predicate it meets. Succeeded is the state most tasks end
-- in and stay in, and no statement looks succeeded tasks up by these two indexes: the
-- operator's filters by workflow, version and state look for failed, cancelled or live
-- tasks, and counting every state of a version reads all of its rows either way. Without
-- them, a one-step workflow's success enters 2 index entries instead of 4, and the indexes
-- hold the tasks operators search instead of the whole history (bench/peers/compare.py:
-- server CPU per workflow; docs/decisions.md, "Succeeded tasks stay out of two indexes").
DROP INDEX toolkit_tasks_definition;
CREATE INDEX toolkit_tasks_definition ON toolkit_tasks (definition_name, definition_version, state)
    WHERE state <> 'succeeded';
DROP INDEX toolkit_tasks_state;
CREATE INDEX toolkit_tasks_state ON toolkit_tasks (state, tenant)
    WHERE state <> 'succeeded';
