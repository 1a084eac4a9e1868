-- The distributed layout (issue 25; docs/scaling.md "A distributed PostgreSQL"): applied by
-- `toolkit db migrate --distribute` (toolkit/store/distribution.py) on a Citus coordinator,
-- on top of the same migrations as one PostgreSQL, each block below in its own
-- transaction, in this order. Every table with a tenant column but the schedules is
-- distributed by tenant, co-located with toolkit_tenants; every other toolkit table is a
-- reference table (a copy on every node). The blocks read the catalog rather than a list,
-- so a later migration's table, key or trigger is either handled or stops the distribution
-- with its name.

-- name: citus_version
-- The version of Citus installed here (no row: none).
SELECT extversion AS citus FROM pg_extension WHERE extname = 'citus';

-- name: distributed
-- Whether the toolkit's tables are distributed yet (Citus installed).
SELECT EXISTS (SELECT 1 FROM pg_dist_partition
               WHERE logicalrelid = to_regclass('toolkit_tasks')) AS distributed;

-- name: prepare_layout
-- What Citus refuses on a distributed table, removed or changed: triggers (the statements do
-- their work since migrations 0029 to 0031), foreign keys between toolkit tables, a null
-- tenant (rows a release before 0026 left get their task's), and any primary key or unique
-- index without the tenant: dropped when 0032 gave it a twin with the tenant (the twin
-- becomes the primary key if it was one), else made again with the tenant last.
DO $$
DECLARE
    r record;
    k record;
    twin text;
    columns text;
    tenant_column int2;
BEGIN
    FOR r IN
        SELECT tg.tgrelid::regclass AS rel, tg.tgname
        FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
        WHERE NOT tg.tgisinternal AND c.relname LIKE 'toolkit\_%'
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
    END LOOP;
    FOR r IN
        SELECT con.conrelid::regclass AS rel, con.conname
        FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
        WHERE con.contype = 'f' AND c.relname LIKE 'toolkit\_%'
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.rel, r.conname);
    END LOOP;
    FOR r IN
        SELECT c.oid::regclass AS rel, c.relname,
               EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                         AND a.attname = 'task_id' AND NOT a.attisdropped) AS per_task
        FROM pg_class c
        WHERE c.relkind = 'r' AND c.relname LIKE 'toolkit\_%' AND c.relname <> 'toolkit_schedules'
          AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                        AND a.attname = 'tenant' AND NOT a.attisdropped)
    LOOP
        IF r.per_task THEN
            EXECUTE format('UPDATE %s x SET tenant = t.tenant FROM toolkit_tasks t '
                           'WHERE t.id = x.task_id AND x.tenant IS NULL', r.rel);
        END IF;
        EXECUTE format('ALTER TABLE %s ALTER COLUMN tenant SET NOT NULL', r.rel);
        SELECT attnum INTO tenant_column FROM pg_attribute
        WHERE attrelid = r.rel AND attname = 'tenant';
        FOR k IN
            SELECT i.indexrelid::regclass AS idx, ic.relname AS name, i.indkey::int2[] AS keys,
                   pg_get_expr(i.indpred, i.indrelid) AS pred, con.conname, con.contype
            FROM pg_index i
            JOIN pg_class ic ON ic.oid = i.indexrelid
            LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = r.rel
            WHERE i.indrelid = r.rel AND i.indisunique AND NOT tenant_column = ANY(i.indkey::int2[])
        LOOP
            IF 0 = ANY(k.keys) THEN
                RAISE EXCEPTION 'unique index % holds an expression: give it the tenant by hand',
                    k.idx;
            END IF;
            SELECT ic.relname INTO twin
            FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
            WHERE i.indrelid = r.rel AND i.indisunique AND i.indexrelid <> k.idx
              AND i.indkey::int2[] = k.keys || tenant_column
              AND pg_get_expr(i.indpred, i.indrelid) IS NOT DISTINCT FROM k.pred;
            SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY u.n) INTO columns
            FROM unnest(k.keys) WITH ORDINALITY AS u(attnum, n)
            JOIN pg_attribute a ON a.attrelid = r.rel AND a.attnum = u.attnum;
            IF k.conname IS NOT NULL THEN
                EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.rel, k.conname);
            ELSE
                EXECUTE format('DROP INDEX %s', k.idx);
            END IF;
            IF twin IS NOT NULL AND k.contype = 'p' THEN
                EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I',
                               r.rel, twin, twin);
            ELSIF twin IS NULL AND k.contype = 'p' THEN
                EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (%s, tenant)',
                               r.rel, k.conname, columns);
            ELSIF twin IS NULL THEN
                EXECUTE format('CREATE UNIQUE INDEX %I ON %s (%s, tenant)%s', k.name, r.rel,
                               columns, coalesce(' WHERE ' || k.pred, ''));
            END IF;
        END LOOP;
    END LOOP;
END $$;

-- name: distribute_by_tenant
-- toolkit_tenants first, then every other table with a tenant column but the schedules (a
-- reference table: the ticker reads them across tenants), co-located with it.
DO $$
DECLARE
    r record;
BEGIN
    PERFORM create_distributed_table('toolkit_tenants', 'tenant');
    FOR r IN
        SELECT c.oid::regclass AS rel FROM pg_class c
        WHERE c.relkind = 'r' AND c.relname LIKE 'toolkit\_%'
          AND c.relname NOT IN ('toolkit_schedules', 'toolkit_tenants')
          AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid
                        AND a.attname = 'tenant' AND NOT a.attisdropped)
        ORDER BY c.relname
    LOOP
        PERFORM create_distributed_table(r.rel, 'tenant', colocate_with => 'toolkit_tenants');
    END LOOP;
END $$;

-- name: reference_tables
-- Every other toolkit table: definitions, workers, limits and their buckets, schedules,
-- bulk plans, event shapes and uses, fleet counts, the schema version.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.oid::regclass AS rel FROM pg_class c
        WHERE c.relkind = 'r' AND c.relname LIKE 'toolkit\_%'
          AND NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = c.oid)
        ORDER BY c.relname
    LOOP
        PERFORM create_reference_table(r.rel);
    END LOOP;
    -- The coordinator's tables keep their rows after copying them to the nodes: drop them.
    FOR r IN
        SELECT logicalrelid AS rel FROM pg_dist_partition WHERE logicalrelid::text LIKE 'toolkit\_%'
    LOOP
        PERFORM truncate_local_data_after_distributing_table(r.rel);
    END LOOP;
END $$;

-- name: distributed_functions
-- The toolkit's functions on every node (the fence, the admission), which a statement
-- routed to a shard may call.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT p.oid::regprocedure AS fn FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'toolkit\_%'
          AND NOT EXISTS (SELECT 1 FROM pg_dist_object o
                          WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
    LOOP
        PERFORM create_distributed_function(r.fn);
    END LOOP;
END $$;

-- name: distribution_report
-- Each toolkit table: how it is laid out (by tenant, reference, or local: left out) and its
-- shards per node (host:port).
SELECT c.relname AS table_name,
       CASE p.partmethod WHEN 'h' THEN 'by tenant' WHEN 'n' THEN 'reference'
            ELSE 'local' END AS layout,
       coalesce((SELECT jsonb_object_agg(s.node, s.shards)
                 FROM (SELECT nodename || ':' || nodeport AS node, count(*) AS shards
                       FROM citus_shards WHERE table_name = c.oid::regclass
                       GROUP BY 1) s), '{}'::jsonb) AS shards
FROM pg_class c
LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid
WHERE c.relkind = 'r' AND c.relname LIKE 'toolkit\_%'
ORDER BY layout, c.relname;
