-- name: resumable_branches
-- The branches of step occurrence %(fanout)s a resumed cycle runs: those running or blocked,
-- and the waiting ones whose wait may have ended (a wake not handled yet, or their timer
-- due), in position order. Parked branches are not read (toolkit_branches_live). A branch
-- waiting for a nested parallel or map step (waits_for 'branches') may go on when a waiting
-- branch nested in it (its occurrences are under 'STEP#N/NAME/') has a wake or a due timer
-- (toolkit_branches_woken, toolkit_branches_timers).
SELECT name, position, status, frame, wakes, seen,
       status = 'waiting' AND run_at <= statement_timestamp() AS due
FROM toolkit_branches b
WHERE task_id = %(task_id)s AND tenant = %(tenant)s AND fanout = %(fanout)s
  AND (status IN ('running', 'blocked')
       OR (status = 'waiting' AND (wakes > seen OR run_at <= statement_timestamp()))
       OR (status = 'waiting' AND waits_for @> '{branches}' AND EXISTS (
               SELECT 1 FROM toolkit_branches i
               WHERE i.task_id = b.task_id AND i.tenant = %(tenant)s AND i.status = 'waiting'
                 AND (i.wakes > i.seen OR i.run_at <= statement_timestamp())
                 AND starts_with(i.fanout, b.fanout || '/' || b.name || '/'))))
ORDER BY position;

-- name: ended_branches
-- Every branch of step occurrence %(fanout)s, in position order: read once, when it ends.
SELECT name, position, status, frame
FROM toolkit_branches
WHERE task_id = %(task_id)s AND tenant = %(tenant)s AND fanout = %(fanout)s
ORDER BY position;

-- name: waiting_branches
-- The waiting branches of step occurrence %(fanout)s (a decided step cancels them).
SELECT name, position, frame, wakes
FROM toolkit_branches
WHERE task_id = %(task_id)s AND tenant = %(tenant)s AND fanout = %(fanout)s
  AND status = 'waiting'
ORDER BY position;

-- name: task_branches
-- Every branch row of a task, for toolkit show and the notebook, in step and position order.
SELECT fanout, name, position, status, frame, run_at, waits_for
FROM toolkit_branches
WHERE task_id = %(task_id)s AND tenant = %(tenant)s
ORDER BY fanout, position
LIMIT %(limit)s;

-- name: signal_waiters
-- The addresses of a task's waiting branches that wait for signal %(name)s (at most a few
-- are read: the sender refuses a task-wide signal when several wait). A branch's address is
-- its name; in a nested parallel or map step, the names of the branches holding it and its
-- own, joined by '/' (its row's occurrences without the 'STEP#N/' parts: '0/approval').
SELECT regexp_replace(b.fanout || '/' || b.name, '[^/]*#[0-9]+/', '', 'g') AS address,
       fanout, name, frame ->> 'cursor' AS cursor
FROM toolkit_branches b
WHERE task_id = %(task_id)s AND tenant = %(tenant)s AND status = 'waiting'
  AND waits_for @> ARRAY['signal:' || %(name)s::text]
ORDER BY fanout, position
LIMIT 20;
