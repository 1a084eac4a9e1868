-- A time plus a number of seconds, as a function PostgreSQL and Citus may take for immutable
-- (issue 25; docs/scaling.md). `at + seconds * interval '1 second'` is marked stable, since
-- adding days or months to a timestamptz reads the time zone; adding seconds never does, so
-- the result depends on the arguments alone. Citus refuses a function that is not
-- immutable in an upsert's DO UPDATE (a debounced submit moves its task's due time there)
-- and in its ON CONFLICT WHERE (a throttle key's next start): those compute their times
-- with this one. A null argument gives null.
CREATE FUNCTION toolkit_seconds_after(at timestamptz, seconds float8)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT at + seconds * interval '1 second'
$$;

-- When a throttle key's last start was taken (database time; null: before this migration).
-- A throttled submit returns the seconds until the start it took, next_at less the period
-- less this; Citus refuses a clock reading in RETURNING, so the statement stores the time
-- it read in the row it returns.
ALTER TABLE toolkit_throttle_keys ADD COLUMN taken_at timestamptz;
