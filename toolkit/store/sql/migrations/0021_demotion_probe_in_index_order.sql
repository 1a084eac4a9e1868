-- The demotion's probe for a task due now reads the tenant's claim index in order.
--
-- Migration 0020 wrote it as EXISTS (... ORDER BY claim time LIMIT 1). PostgreSQL drops
-- the ORDER BY and LIMIT of an EXISTS sub-select, and the planner, which cannot see the
-- time bound's value, expected many of the tenant's tasks to be due and scanned the whole
-- table for a first row it did not find when every task was parked: each claim that found a
-- tenant dry read all of its parked tasks (50 ms with 100,000 timers in one tenant;
-- bench/parked.py). As a scalar sub-select the order and the limit stay, and the probe is
-- the index range that ends at now, as in idle_state. The function is otherwise unchanged.

CREATE OR REPLACE FUNCTION toolkit_demote_tenants(dry text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    locked text[];
BEGIN
    locked := ARRAY(SELECT tenant FROM toolkit_tenants
                    WHERE tenant = ANY(dry) AND ready
                    ORDER BY tenant
                    FOR UPDATE SKIP LOCKED);
    IF cardinality(locked) = 0 THEN
        RETURN 0;
    END IF;
    WITH probed AS (
        SELECT tn.tenant,
               coalesce((
                   SELECT true FROM toolkit_tasks
                   WHERE tenant = tn.tenant
                     AND state IN ('queued', 'leased', 'waiting')
                     AND (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                          AT TIME ZONE 'UTC') - priority * interval '1 minute'
                         <= (SELECT clock_timestamp() AT TIME ZONE 'UTC')
                     AND CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                         <= (SELECT clock_timestamp())
                   ORDER BY (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                             AT TIME ZONE 'UTC') - priority * interval '1 minute'
                   LIMIT 1
               ), false) AS due_now,
               least(
                   (SELECT ((CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                             AT TIME ZONE 'UTC') - priority * interval '1 minute')
                           AT TIME ZONE 'UTC'
                    FROM toolkit_tasks
                    WHERE tenant = tn.tenant
                      AND state IN ('queued', 'leased', 'waiting')
                      AND (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                           AT TIME ZONE 'UTC') - priority * interval '1 minute'
                          > (SELECT clock_timestamp() AT TIME ZONE 'UTC')
                    ORDER BY (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                              AT TIME ZONE 'UTC') - priority * interval '1 minute'
                    LIMIT 1),
                   (SELECT CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                    FROM toolkit_tasks
                    WHERE tenant = tn.tenant AND priority > 0
                      AND state IN ('queued', 'leased', 'waiting')
                    ORDER BY CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                    LIMIT 1)
               ) AS next_due
        FROM toolkit_tenants tn
        WHERE tn.tenant = ANY(locked)
    )
    UPDATE toolkit_tenants tn
    SET ready = p.due_now,
        next_due = CASE WHEN p.due_now THEN NULL ELSE p.next_due END,
        vtime = tn.vtime + CASE WHEN p.due_now THEN 1.0 / tn.weight ELSE 0 END
    FROM probed p
    WHERE tn.tenant = p.tenant AND tn.tenant = ANY(locked);
    RETURN cardinality(locked);
END $$;
