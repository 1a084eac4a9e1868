-- The tenant rotation (issue 20, docs/decisions.md "The fair claim at any number of
-- tenants"): a claim reads the few tenants it picks, not every tenant.
--
-- ready: the tenant may have due work now; the claim picks among the ready, unpaused
-- tenants those of lowest vtime. vtime: tasks claimed per unit of weight while tenants
-- competed for the claim's window (the rotation). next_due: for a tenant not ready, a lower
-- bound of the due times of its live tasks (NULL: it has none); a claim promotes the tenants
-- whose next_due has come. The invariant the triggers below and the demotion keep:
--   a live task due at d, of a tenant not ready, has next_due <= d.
-- A tenant row starts ready (always safe: a claim that finds it dry demotes it).
ALTER TABLE toolkit_tenants
    ADD COLUMN ready boolean NOT NULL DEFAULT true,
    ADD COLUMN vtime float8 NOT NULL DEFAULT 0,
    ADD COLUMN next_due timestamptz;

-- The window: the K ready, unpaused tenants of lowest vtime, one index range.
CREATE INDEX toolkit_tenants_rotation ON toolkit_tenants (vtime, tenant)
    WHERE ready AND NOT paused;
-- The promotion: the tenants not ready whose next_due has come, one index range.
CREATE INDEX toolkit_tenants_next_due ON toolkit_tenants (next_due) WHERE NOT ready;
-- Whether any unpaused tenant has a max_active, without reading every tenant.
CREATE INDEX toolkit_tenants_limited ON toolkit_tenants (tenant)
    WHERE max_active IS NOT NULL AND NOT paused;

-- A tenant that enters the ready, unpaused set (created, promoted, resumed) starts at the
-- lowest vtime there: no burst of credit from its time away, and nobody behind it waits for
-- it to catch up from zero.
CREATE FUNCTION toolkit_tenant_joins_rotation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.vtime := greatest(NEW.vtime, coalesce(
        (SELECT vtime FROM toolkit_tenants
         WHERE ready AND NOT paused AND tenant <> NEW.tenant
         ORDER BY vtime, tenant LIMIT 1), NEW.vtime));
    RETURN NEW;
END $$;

CREATE TRIGGER toolkit_tenants_join_rotation
    BEFORE INSERT ON toolkit_tenants
    FOR EACH ROW
    WHEN (NEW.ready AND NOT NEW.paused)
    EXECUTE FUNCTION toolkit_tenant_joins_rotation();

CREATE TRIGGER toolkit_tenants_rejoin_rotation
    BEFORE UPDATE OF ready, paused ON toolkit_tenants
    FOR EACH ROW
    WHEN (NEW.ready AND NOT NEW.paused AND (NOT OLD.ready OR OLD.paused))
    EXECUTE FUNCTION toolkit_tenant_joins_rotation();

-- Every write that makes a task due sooner (a submit; a release, retry, wake-up, redrive,
-- admission ...) keeps the invariant: it takes KEY SHARE on the tenant row first (as a
-- foreign key check would; no conflict with the claim's writes nor with other submitters),
-- then lowers next_due if the tenant is not ready. The demotion locks the tenant row FOR
-- UPDATE SKIP LOCKED: a tenant with such a write in flight is not demoted; a write that
-- comes after the demotion's lock waits for it to commit, then finds the tenant not ready
-- and lowers next_due itself (docs/decisions.md).
CREATE FUNCTION toolkit_tasks_inserted_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1
    FROM toolkit_tenants tn
    WHERE tn.tenant IN (SELECT DISTINCT tenant FROM inserted
                        WHERE state IN ('queued', 'leased', 'waiting'))
    ORDER BY tn.tenant
    FOR KEY SHARE OF tn;
    UPDATE toolkit_tenants tn
    SET next_due = due.at
    FROM (SELECT tenant,
                 min(CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END) AS at
          FROM inserted
          WHERE state IN ('queued', 'leased', 'waiting')
          GROUP BY tenant) due
    WHERE tn.tenant = due.tenant AND NOT tn.ready
      AND (tn.next_due IS NULL OR tn.next_due > due.at);
    RETURN NULL;
END $$;

CREATE TRIGGER toolkit_tasks_inserted_due
    AFTER INSERT ON toolkit_tasks
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    EXECUTE FUNCTION toolkit_tasks_inserted_due();

CREATE FUNCTION toolkit_task_due_sooner() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := CASE WHEN NEW.state = 'leased' THEN NEW.lease_expires_at
                           ELSE NEW.run_at END;
BEGIN
    PERFORM 1 FROM toolkit_tenants WHERE tenant = NEW.tenant FOR KEY SHARE;
    UPDATE toolkit_tenants
    SET next_due = at
    WHERE tenant = NEW.tenant AND NOT ready AND (next_due IS NULL OR next_due > at);
    RETURN NULL;
END $$;

CREATE TRIGGER toolkit_tasks_due_sooner
    AFTER UPDATE OF state, run_at, lease_expires_at ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.state IN ('queued', 'leased', 'waiting')
          AND (OLD.state NOT IN ('queued', 'leased', 'waiting')
               OR CASE WHEN NEW.state = 'leased' THEN NEW.lease_expires_at ELSE NEW.run_at END
                  < CASE WHEN OLD.state = 'leased' THEN OLD.lease_expires_at
                         ELSE OLD.run_at END))
    EXECUTE FUNCTION toolkit_task_due_sooner();

-- The demotion of tenants a claim found dry. One statement, so that no client can hold its
-- lock between the two steps (a worker stopped there would block every submit of the
-- tenant); in a VOLATILE function each query takes its own snapshot:
-- 1. lock those still ready FOR UPDATE, skipping any row locked otherwise: FOR UPDATE
--    conflicts with the KEY SHARE of the due-sooner triggers, so a tenant with such a write
--    in flight is not demoted this time;
-- 2. in a snapshot taken after those locks (every write that locked before is committed and
--    seen), a tenant with a task due now (of any definition: another worker's, or held back
--    by its max_active) stays ready and moves on by one task per unit of weight, as if
--    served, so that it cannot hold the window; any other leaves the rotation until
--    next_due, a lower bound of its live tasks' due times: the first future entry of its
--    claim index or the first due time of its tasks above priority 0, whichever is sooner
--    (as idle_state reads them).
-- Returns how many tenants it locked.
CREATE FUNCTION toolkit_demote_tenants(dry text[]) RETURNS integer
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
               EXISTS (
                   SELECT 1 FROM toolkit_tasks
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
               ) AS due_now,
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

-- The tenants of today: those without a live task leave the rotation until they have one.
UPDATE toolkit_tenants tn
SET ready = false
WHERE NOT EXISTS (SELECT 1 FROM toolkit_tasks t
                  WHERE t.tenant = tn.tenant AND t.state IN ('queued', 'leased', 'waiting'));
