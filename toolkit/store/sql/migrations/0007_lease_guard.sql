-- The fence, written once (DESIGN §2): does the lease of (worker_id, token) on task row t
-- still hold, now? Every statement that changes a leased task's state, or writes on its
-- behalf, applies only to rows for which this is true, in the same statement. A write that
-- finds none changes nothing and its caller gets LeaseLost.
--
-- One expression of a SQL function: the planner inlines it (and a field of the whole-row
-- argument becomes a plain column), so each statement plans exactly as with the five terms
-- written out. The tenant is a term so that a store distributed by tenant routes each fenced
-- statement to one shard (DESIGN §6).
CREATE FUNCTION toolkit_lease_held(t toolkit_tasks, worker_id text, tenant text, token bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT t.lease_owner = worker_id
       AND t.tenant = tenant
       AND t.lease_token = token
       AND t.state = 'leased'
       AND t.lease_expires_at > clock_timestamp()
$$;
