-- name: register_worker
-- Registers a worker id under this process's %(incarnation)s; refused (no row) while another
-- live process holds the same id. %(dead_pid)s names a process of this host known to be gone,
-- whose registration may be taken over at once (a restart after a crash).
INSERT INTO toolkit_workers
    (worker_id, incarnation, pid, host, concurrency, lease_seconds, heartbeat_seconds,
     definitions, expires_at)
VALUES (%(worker_id)s, %(incarnation)s, %(pid)s, %(host)s, %(concurrency)s, %(lease_seconds)s,
        %(heartbeat_seconds)s, %(definitions)s,
        statement_timestamp() + %(lease_seconds)s * interval '1 second')
ON CONFLICT (worker_id) DO UPDATE
SET incarnation = excluded.incarnation,
    pid = excluded.pid,
    host = excluded.host,
    concurrency = excluded.concurrency,
    lease_seconds = excluded.lease_seconds,
    heartbeat_seconds = excluded.heartbeat_seconds,
    definitions = excluded.definitions,
    started_at = excluded.started_at,
    heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at,
    stopped_at = NULL
WHERE toolkit_workers.stopped_at IS NOT NULL
   OR toolkit_workers.expires_at <= excluded.started_at
   OR (toolkit_workers.host = excluded.host AND toolkit_workers.pid = %(dead_pid)s::integer)
RETURNING worker_id;

-- name: get_worker
SELECT worker_id, pid, host, concurrency, lease_seconds, heartbeat_seconds, definitions,
       started_at, heartbeat_at, expires_at, stopped_at,
       stopped_at IS NULL AND expires_at > statement_timestamp() AS live
FROM toolkit_workers
WHERE worker_id = %(worker_id)s;

-- name: stop_worker
-- Records this incarnation's registration stopped (not one that took the id over since).
UPDATE toolkit_workers
SET stopped_at = statement_timestamp()
WHERE worker_id = %(worker_id)s AND incarnation = %(incarnation)s AND stopped_at IS NULL;

-- name: list_workers
-- Live workers first, then those stopped or expired (crashed) within the last day.
SELECT worker_id, pid, host, concurrency, lease_seconds, heartbeat_seconds, definitions,
       started_at, heartbeat_at, expires_at, stopped_at,
       stopped_at IS NULL AND expires_at > statement_timestamp() AS live
FROM toolkit_workers
WHERE coalesce(stopped_at, expires_at) > statement_timestamp() - interval '1 day'
ORDER BY live DESC, heartbeat_at DESC;

-- name: health_workers
-- Live workers with their lease settings and the age of their last heartbeat, seconds.
SELECT worker_id, lease_seconds, heartbeat_seconds,
       extract(epoch FROM statement_timestamp() - heartbeat_at)::float8 AS heartbeat_age
FROM toolkit_workers
WHERE stopped_at IS NULL AND expires_at > statement_timestamp()
ORDER BY worker_id;

-- name: health_counts
-- The figures `toolkit doctor` judges: the oldest due task's age (seconds; tasks of paused
-- tenants are not due to any worker), tasks in reconciliation, expired leases not reclaimed.
SELECT
    (SELECT extract(epoch FROM statement_timestamp() - min(run_at))::float8
     FROM toolkit_tasks
     WHERE state = 'queued' AND run_at <= statement_timestamp()
       AND tenant <> ALL (ARRAY(SELECT tenant FROM toolkit_tenants WHERE paused)))
        AS oldest_due_age,
    (SELECT count(*) FROM toolkit_tasks
     WHERE state = 'waiting' AND wait_reason = 'reconciliation') AS reconciliation,
    (SELECT count(*) FROM toolkit_tasks
     WHERE state = 'leased' AND lease_expires_at <= statement_timestamp()) AS expired_leases;

-- name: refresh_fleet_counts
-- Count the fleet gauges again when the stored counts are %(every)s seconds old or older
-- (toolkit_fleet_counts, migration 0022): one worker of the fleet counts per interval, not
-- each. A second refresh meanwhile waits for the first's row lock and then finds the counts
-- fresh: it counts nothing and returns no row (the sub-selects run only for the row updated).
UPDATE toolkit_fleet_counts
SET refreshed_at = statement_timestamp(),
    unavailable = (SELECT coalesce(jsonb_agg(u), '[]') FROM (
-- include: unavailable_definition_counts
        ) u),
    held = (SELECT coalesce(jsonb_agg(h), '[]') FROM (
-- include: held_task_counts
        ) h)
WHERE refreshed_at <= statement_timestamp() - make_interval(secs => %(every)s)
RETURNING unavailable, held;

-- name: fleet_counts
-- The fleet gauges' counts as last counted (refresh_fleet_counts).
SELECT unavailable, held FROM toolkit_fleet_counts;
