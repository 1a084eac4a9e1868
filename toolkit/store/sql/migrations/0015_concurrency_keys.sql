-- Concurrency keys (issue 20, docs/flow-control.md): a definition's `concurrency: {key,
-- max_active, on_conflict}` lets at most max_active live tasks of one key value (per tenant
-- and definition name) hold the key, from their admission until they end. A keyed task is
-- admitted by its insert when its key is free, else inserted parked (waiting, reason
-- 'concurrency', run_at never) with a wake row saying that its key may have room; the
-- admission (toolkit_admit_keys, run by claiming workers) admits parked tasks in id
-- (submission) order. Both decide for a key under its transaction-level advisory lock,
-- tried, never waited for. Ends only append wake rows: they lock nothing another statement
-- holds, so no two group commits deadlock over keys.
ALTER TABLE toolkit_tasks
    ADD COLUMN concurrency_key text,
    -- the definition's max_active when the task was submitted
    ADD COLUMN concurrency_limit integer CHECK (concurrency_limit >= 1),
    -- admitted: the task holds its key until it ends
    ADD COLUMN key_held boolean NOT NULL DEFAULT false,
    -- a delayed start given at submit, kept while the task waits for its key
    ADD COLUMN start_after timestamptz,
    ADD CHECK ((concurrency_key IS NULL) = (concurrency_limit IS NULL));

ALTER TABLE toolkit_tasks DROP CONSTRAINT toolkit_tasks_wait_reason_check;
ALTER TABLE toolkit_tasks ADD CONSTRAINT toolkit_tasks_wait_reason_check
    CHECK (wait_reason IN ('timer', 'signal', 'callback', 'child', 'budget', 'limit',
                           'reconciliation', 'start', 'branches', 'concurrency'));

-- The live tasks holding a key (counted by the admission, bounded by max_active).
CREATE INDEX toolkit_tasks_key_holders
    ON toolkit_tasks (tenant, definition_name, concurrency_key)
    WHERE key_held AND state IN ('queued', 'leased', 'waiting');
-- The tasks waiting for a key, in submission order.
CREATE INDEX toolkit_tasks_key_queue
    ON toolkit_tasks (tenant, definition_name, concurrency_key, id)
    WHERE state = 'waiting' AND wait_reason = 'concurrency';

-- "This key may have room": appended by a keyed task's submit, end and re-entry; deleted by
-- the admission that looks at the key. Never updated, so appending never waits.
CREATE TABLE toolkit_key_wakes (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant          text NOT NULL,
    definition_name text NOT NULL,
    concurrency_key text NOT NULL
);
CREATE INDEX toolkit_key_wakes_key
    ON toolkit_key_wakes (tenant, definition_name, concurrency_key);

-- A keyed task is admitted or parked, whatever statement inserts it (submit, keyed submit, a
-- schedule's tick, an event's trigger, a child workflow). It is admitted at once (it holds
-- the key, its state is kept) when the key is free: no other transaction is deciding for the
-- key (its advisory lock, tried, not waited for, and held to commit, as the admission
-- holds it), no task waits for it, and it has fewer live holders than max_active; each
-- query here sees what committed before it ran, and the rows this statement wrote before.
-- A transaction tries at most 32 keys so (a lock held to commit each); the others, and
-- every task of a busy key, are parked: waiting, reason 'concurrency', with a wake row for
-- the admission, a delayed start kept aside.
CREATE FUNCTION toolkit_park_for_key() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    tried integer := coalesce(nullif(current_setting('toolkit.key_locks', true), ''), '0')::int;
BEGIN
    IF tried < 32 AND pg_try_advisory_xact_lock(hashtextextended(
            NEW.tenant || chr(31) || NEW.definition_name || chr(31) || NEW.concurrency_key, 20))
    THEN
        PERFORM set_config('toolkit.key_locks', (tried + 1)::text, true);
        IF NOT EXISTS (SELECT 1 FROM toolkit_tasks
                       WHERE tenant = NEW.tenant AND definition_name = NEW.definition_name
                         AND concurrency_key = NEW.concurrency_key
                         AND state = 'waiting' AND wait_reason = 'concurrency')
           AND (SELECT count(*) FROM toolkit_tasks
                WHERE tenant = NEW.tenant AND definition_name = NEW.definition_name
                  AND concurrency_key = NEW.concurrency_key
                  AND key_held AND state IN ('queued', 'leased', 'waiting'))
               < NEW.concurrency_limit
        THEN
            NEW.key_held := true;
            RETURN NEW;
        END IF;
    END IF;
    NEW.start_after := CASE WHEN NEW.state = 'waiting' AND NEW.wait_reason = 'start'
                            THEN NEW.run_at END;
    NEW.state := 'waiting';
    NEW.wait_reason := 'concurrency';
    -- never, but a workflow deadline still comes: the task then times out unadmitted
    NEW.run_at := least('9999-12-31T00:00:00+00:00'::timestamptz, NEW.deadline_at);
    NEW.key_held := false;
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    VALUES (NEW.tenant, NEW.definition_name, NEW.concurrency_key);
    RETURN NEW;
END $$;

CREATE TRIGGER toolkit_tasks_park_for_key
    BEFORE INSERT ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION toolkit_park_for_key();

-- A keyed task that comes back to life (a redrive of a failed one) waits for its key again.
CREATE TRIGGER toolkit_tasks_repark_for_key
    BEFORE UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL
          AND OLD.state IN ('succeeded', 'failed', 'cancelled')
          AND NEW.state IN ('queued', 'leased', 'waiting'))
    EXECUTE FUNCTION toolkit_park_for_key();

-- A holder that ends, whatever statement ends it, says its key has room, and wakes idle
-- workers when a task waits for the key (only then: a NOTIFY serialises commits).
CREATE FUNCTION toolkit_release_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO toolkit_key_wakes (tenant, definition_name, concurrency_key)
    VALUES (NEW.tenant, NEW.definition_name, NEW.concurrency_key);
    IF EXISTS (SELECT 1 FROM toolkit_tasks
               WHERE tenant = NEW.tenant AND definition_name = NEW.definition_name
                 AND concurrency_key = NEW.concurrency_key
                 AND state = 'waiting' AND wait_reason = 'concurrency') THEN
        PERFORM pg_notify('toolkit_wakeup', '');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER toolkit_tasks_release_key
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.key_held
          AND NEW.state IN ('succeeded', 'failed', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION toolkit_release_key();

-- The admission: for up to max_keys keys with wake rows (in key order), under the key's
-- advisory lock (a key another admission holds is left to it), delete its wake rows, count
-- its live holders, and admit its oldest parked tasks up to max_active (the limit the oldest
-- was submitted with): queued now, or waiting for a delayed start. Each admission is a
-- 'key_admitted' event. Every statement here sees what committed before it ran (a fresh
-- snapshot), so a holder's end is either counted as ended or leaves a wake row for the
-- next admission; a parked task committed after the count has its own wake row.
-- Returns how many tasks were admitted and whether wake rows remain.
CREATE FUNCTION toolkit_admit_keys(max_keys integer, OUT admitted integer, OUT remaining boolean)
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
            RETURNING t.id, t.concurrency_key, t.concurrency_limit
        )
        INSERT INTO toolkit_task_events (task_id, kind, detail)
        SELECT id, 'key_admitted',
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
