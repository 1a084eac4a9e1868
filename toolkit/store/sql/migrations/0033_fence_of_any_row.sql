-- The fence takes its task row as a polymorphic argument (issue 25; docs/scaling.md). A
-- distributed table's statement is sent to the node holding its shard with the shard's own
-- table name (toolkit_tasks_102042), whose row type is not toolkit_tasks: a function taking
-- toolkit_tasks cannot be called there, and every fenced SELECT failed on Citus. Taking
-- anyelement, it is called with either; PostgreSQL inlines it as before (one plan, no call),
-- on one server and on each shard.
--
-- Same name and arguments: the previous release's statements, still running during an
-- upgrade, call this one; their plans are made again when the old function goes.
DROP FUNCTION toolkit_lease_held(toolkit_tasks, text, text, bigint);

CREATE FUNCTION toolkit_lease_held(t anyelement, worker_id text, tenant text, token bigint)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT t.lease_owner = worker_id
       AND t.tenant = tenant
       AND t.lease_token = token
       AND t.state = 'leased'
       AND t.lease_expires_at > statement_timestamp()
$$;
