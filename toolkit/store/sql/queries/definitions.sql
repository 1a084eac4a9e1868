-- name: insert_definition
-- Registers a definition version; a second insert of the same (name, version) changes nothing.
-- Every unique key is an arbiter (no conflict target): the digest's too. Two workers that
-- start together register the same version at once; with (name, version) alone the second
-- could pass that key's check before the first inserted and then fail on the digest's
-- unique index once the first committed (a worker's start ended by a 23505).
INSERT INTO toolkit_definitions (name, version, digest, body, source)
VALUES (%(name)s, %(version)s, %(digest)s, %(body)s, %(source)s)
ON CONFLICT DO NOTHING
RETURNING name;

-- name: get_definition
SELECT name, version, digest, body, source, deployed_at, retired_at
FROM toolkit_definitions
WHERE name = %(name)s AND version = %(version)s;

-- name: latest_definition
SELECT name, version, digest, body, source, deployed_at, retired_at
FROM toolkit_definitions
WHERE name = %(name)s AND retired_at IS NULL
ORDER BY version DESC
LIMIT 1;

-- name: list_definitions
-- Each version with its task counts by state, and whether a live worker has it loaded: a
-- version with live tasks and no such worker is "definition unavailable" (DESIGN §5).
SELECT d.name, d.version, d.digest, d.deployed_at, d.retired_at,
       EXISTS (SELECT 1 FROM toolkit_workers w
               WHERE w.stopped_at IS NULL AND w.expires_at > statement_timestamp()
                 AND w.definitions @> jsonb_build_array(jsonb_build_object('digest', d.digest))
       ) AS served,
       coalesce(c.counts, '{}'::jsonb) AS task_counts
FROM toolkit_definitions d
-- The counts by a join to the tasks grouped by version, not a sub-select per version (Citus
-- refuses a correlated sub-select beside a reference table, the definitions).
LEFT JOIN (SELECT s.definition_name, s.definition_version,
                  jsonb_object_agg(s.state, s.n) AS counts
           FROM (SELECT definition_name, definition_version, state, count(*) AS n
                 FROM toolkit_tasks
                 GROUP BY definition_name, definition_version, state) s
           GROUP BY s.definition_name, s.definition_version) c
  ON c.definition_name = d.name AND c.definition_version = d.version
ORDER BY d.name, d.version;

-- name: retire_definition
-- A retired version takes no new submissions; its tasks run on.
UPDATE toolkit_definitions
SET retired_at = coalesce(retired_at, (SELECT statement_timestamp()))
WHERE name = %(name)s AND version = %(version)s
RETURNING name;

-- name: restore_definition
-- A retired version takes new submissions again.
UPDATE toolkit_definitions
SET retired_at = NULL
WHERE name = %(name)s AND version = %(version)s
RETURNING name;

-- name: newest_version
-- The newest version of a name, retired or not (why nothing is submittable).
SELECT version, retired_at IS NOT NULL AS retired
FROM toolkit_definitions
WHERE name = %(name)s
ORDER BY version DESC
LIMIT 1;

-- name: delete_definition
-- Deletes a version only when no queued, leased (recoverable included) or waiting task
-- references it; returns the live counts either way (deleted tells which happened).
WITH live AS (
    SELECT state, count(*) AS n
    FROM toolkit_tasks
    WHERE definition_name = %(name)s AND definition_version = %(version)s
      AND state IN ('queued', 'leased', 'waiting')
    GROUP BY state
), deleted AS (
    DELETE FROM toolkit_definitions
    WHERE name = %(name)s AND version = %(version)s AND NOT EXISTS (SELECT 1 FROM live)
    RETURNING name
)
SELECT EXISTS (SELECT 1 FROM deleted) AS deleted,
       coalesce((SELECT jsonb_object_agg(state, n) FROM live), '{}'::jsonb) AS live;

-- name: unavailable_definitions
-- include: unavailable_definition_counts

-- fragment: unavailable_definition_counts
-- Live tasks whose definition version no live worker has loaded ("definition unavailable").
SELECT t.definition_name, t.definition_version, count(*) AS n
FROM toolkit_tasks t
WHERE t.state IN ('queued', 'leased', 'waiting')
  AND NOT EXISTS (
      SELECT 1 FROM toolkit_workers w
      WHERE w.stopped_at IS NULL AND w.expires_at > statement_timestamp()
        AND w.definitions @> jsonb_build_array(jsonb_build_object('digest', t.definition_digest)))
GROUP BY t.definition_name, t.definition_version
