-- The demotion decides "due now" and "next due" at one instant.
--
-- Migration 0021's probe read clock_timestamp() in two sub-selects: whether a task is due
-- (its time <= now) and the tenant's next due time (the first time > now). Each sub-select
-- read the clock when it ran, so a task whose time fell between the two readings was
-- neither: the tenant left the rotation with a next_due after that task's due time (or
-- none), breaking the rotation's invariant, and no claim took the task again while the
-- idle check saw it queued: a worker spun until its deadline. On a loaded server the two
-- readings are milliseconds apart, and a retry 10 ms away fell between them (a golden
-- history's resume timed out in CI). Both now compare with one instant, read once after the
-- locks; the function is otherwise unchanged.

CREATE OR REPLACE FUNCTION toolkit_demote_tenants(dry text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    locked text[];
    now_at timestamptz;
BEGIN
    locked := ARRAY(SELECT tenant FROM toolkit_tenants
                    WHERE tenant = ANY(dry) AND ready
                    ORDER BY tenant
                    FOR UPDATE SKIP LOCKED);
    IF cardinality(locked) = 0 THEN
        RETURN 0;
    END IF;
    now_at := clock_timestamp();  -- one instant for "due now" and "the next due time"
    WITH probed AS (
        SELECT tn.tenant,
               coalesce((
                   SELECT true FROM toolkit_tasks
                   WHERE tenant = tn.tenant
                     AND state IN ('queued', 'leased', 'waiting')
                     AND (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                          AT TIME ZONE 'UTC') - priority * interval '1 minute'
                         <= (now_at AT TIME ZONE 'UTC')
                     AND CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END
                         <= now_at
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
                          > (now_at AT TIME ZONE 'UTC')
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
