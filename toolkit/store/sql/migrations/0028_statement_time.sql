-- Database time that a distributed store's coordinator can give (issue 25, third step;
-- docs/scaling.md, "A distributed PostgreSQL (Citus on `tenant`)").
--
-- Citus refuses a VOLATILE function such as clock_timestamp() in a statement that modifies
-- a distributed table; statement_timestamp() (STABLE) it evaluates once on the
-- coordinator. Every query of this release reads statement_timestamp(); here every toolkit
-- function and every column default that read clock_timestamp() is rewritten to read it
-- too. statement_timestamp() is the time the statement began: one instant for the whole
-- statement (as the demotion and the idle check already wanted), never before its
-- transaction began (as the export's horizon needs), and the fence stays sound: a fenced
-- write compares the token first, and a lease that expires while the write waits for the
-- row's lock was raised by no claim (the recheck of the locked row would see the new token),
-- so the write lands as if just before the expiry (docs/decisions.md).
DO $$
DECLARE
    f record;
    d record;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p
             WHERE p.proname LIKE 'toolkit\_%'
               AND p.pronamespace = to_regnamespace(current_schema())
               AND p.prosrc LIKE '%clock\_timestamp()%'
    LOOP
        EXECUTE replace(pg_get_functiondef(f.oid), 'clock_timestamp()', 'statement_timestamp()');
    END LOOP;
    FOR d IN SELECT c.relname, a.attname FROM pg_attrdef ad
             JOIN pg_class c ON c.oid = ad.adrelid
             JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
             WHERE c.relname LIKE 'toolkit\_%'
               AND c.relnamespace = to_regnamespace(current_schema())
               AND pg_get_expr(ad.adbin, ad.adrelid) LIKE '%clock\_timestamp()%'
    LOOP
        EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET DEFAULT statement_timestamp()',
                       d.relname, d.attname);
    END LOOP;
END $$;

-- The fence reads the statement's time now, one value for the whole statement: it is
-- STABLE, as Citus requires of a function in an update of a distributed table (a STABLE SQL
-- function is inlined as before).
ALTER FUNCTION toolkit_lease_held(toolkit_tasks, text, text, bigint) STABLE;
