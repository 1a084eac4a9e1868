-- Whether the lease was taken by a worker with a checkpoint window (`toolkit run
-- --checkpoint-window`, docs/effects.md#the-checkpoint-window): such a worker may run past
-- the stored cursor without writing, so when its lease lapses, the step under the cursor is
-- not known to be the one that crashed. The claim that takes such a lease over learns it
-- (ClaimedTask.deferred_before) and counts the lapse against the task, not against that
-- step (a helper's report: the step before the crash was blamed, failing a healthy task, or
-- letting a step that crashes every worker crash them for ever). A claim of a lease that
-- lapsed never defers. Workers of the previous release leave it false.
ALTER TABLE toolkit_tasks ADD COLUMN lease_deferred boolean NOT NULL DEFAULT false;
