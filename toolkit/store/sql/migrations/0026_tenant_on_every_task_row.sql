-- Every per-task table carries its task's tenant (issue 25, first step; docs/scaling.md,
-- "A distributed PostgreSQL (Citus on `tenant`)").
--
-- Citus keeps a distributed table's rows on the node of their distribution column's value,
-- and co-locates two tables' rows only when both have that column: a task's evidence,
-- events, signals, callbacks, limit slots, branch rows and stream values can live beside
-- the task only if they carry its tenant. On one PostgreSQL the column is written and
-- otherwise unused: every statement of this release that inserts such a row sets it from
-- the task's row in the same statement. The rows already there get it here.
--
-- The column stays nullable: the runbook migrates while the previous release's workers
-- still run (docs/operations.md, "Deploying a release"), and their inserts do not name it.
-- Distributing the tables fills what those left empty and makes it NOT NULL then.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['toolkit_effect_evidence', 'toolkit_task_events',
                                'toolkit_signals', 'toolkit_callbacks', 'toolkit_limit_slots',
                                'toolkit_branches', 'toolkit_task_stream']
    LOOP
        EXECUTE format('ALTER TABLE %I ADD COLUMN tenant text', name);
        EXECUTE format('UPDATE %I x SET tenant = t.tenant FROM toolkit_tasks t '
                       'WHERE t.id = x.task_id', name);
    END LOOP;
END $$;

-- toolkit_admit_keys (migration 0015) writes its key_admitted events with the tenant.
CREATE OR REPLACE FUNCTION toolkit_admit_keys(max_keys integer, OUT admitted integer, OUT remaining boolean)
LANGUAGE plpgsql AS $$
DECLARE
    k record;
    held integer;
    room integer;
    n integer;
BEGIN
    admitted := 0;
    FOR k IN
        SELECT DISTINCT tenant, definition_name, concurrency_key
        FROM toolkit_key_wakes
        ORDER BY tenant, definition_name, concurrency_key
        LIMIT max_keys
    LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtextextended(
            k.tenant || chr(31) || k.definition_name || chr(31) || k.concurrency_key, 20));
        DELETE FROM toolkit_key_wakes
        WHERE tenant = k.tenant AND definition_name = k.definition_name
          AND concurrency_key = k.concurrency_key;
        SELECT count(*) INTO held FROM toolkit_tasks
        WHERE tenant = k.tenant AND definition_name = k.definition_name
          AND concurrency_key = k.concurrency_key
          AND key_held AND state IN ('queued', 'leased', 'waiting');
        SELECT concurrency_limit - held INTO room FROM toolkit_tasks
        WHERE tenant = k.tenant AND definition_name = k.definition_name
          AND concurrency_key = k.concurrency_key
          AND state = 'waiting' AND wait_reason = 'concurrency'
        ORDER BY id LIMIT 1;
        CONTINUE WHEN room IS NULL OR room <= 0;
        WITH next AS (
            SELECT id FROM toolkit_tasks
            WHERE tenant = k.tenant AND definition_name = k.definition_name
              AND concurrency_key = k.concurrency_key
              AND state = 'waiting' AND wait_reason = 'concurrency'
            ORDER BY id
            LIMIT room
            FOR UPDATE
        ), taken AS (
            UPDATE toolkit_tasks t
            SET state = CASE WHEN t.start_after > clock_timestamp() THEN 'waiting'
                             ELSE 'queued' END,
                wait_reason = CASE WHEN t.start_after > clock_timestamp() THEN 'start' END,
                run_at = least(greatest(t.start_after, clock_timestamp()),
                               coalesce(t.deadline_at, 'infinity')),
                start_after = NULL,
                key_held = true,
                updated_at = clock_timestamp()
            FROM next
            WHERE t.id = next.id AND t.state = 'waiting' AND t.wait_reason = 'concurrency'
            RETURNING t.id, t.tenant, t.concurrency_key, t.concurrency_limit
        )
        INSERT INTO toolkit_task_events (task_id, tenant, kind, detail)
        SELECT id, tenant, 'key_admitted',
               jsonb_build_object('key', concurrency_key, 'max_active', concurrency_limit,
                                  'holders', held)
        FROM taken;
        GET DIAGNOSTICS n = ROW_COUNT;
        admitted := admitted + n;
    END LOOP;
    IF admitted > 0 THEN
        PERFORM pg_notify('toolkit_wakeup', '');
    END IF;
    remaining := EXISTS (SELECT 1 FROM toolkit_key_wakes);
END $$;
