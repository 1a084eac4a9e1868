-- name: insert_definition
-- Registers a definition version; a second insert of the same (name, version) changes nothing.
INSERT INTO toolkit_definitions (name, version, digest, body, source)
VALUES (%(name)s, %(version)s, %(digest)s, %(body)s, %(source)s)
ON CONFLICT (name, version) DO NOTHING
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
SELECT d.name, d.version, d.digest, d.deployed_at, d.retired_at,
       coalesce(
           (SELECT jsonb_object_agg(s.state, s.n)
            FROM (SELECT state, count(*) AS n
                  FROM toolkit_tasks t
                  WHERE t.definition_name = d.name AND t.definition_version = d.version
                  GROUP BY state) s),
           '{}'::jsonb) AS task_counts
FROM toolkit_definitions d
ORDER BY d.name, d.version;
