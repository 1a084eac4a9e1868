-- Recurring schedules and delayed starts (issue 17; docs/schedules.md).

-- A schedule starts one task per tick of its cadence (a cron in a time zone, or an interval),
-- of the newest active version of its definition. next_tick is the first tick not handled
-- yet, in database time; firing a tick is a compare-and-set on it (fire_schedule), and each
-- tick's task has the idempotency key schedule/NAME/TICK, so a tick is at most one task
-- however many workers fire at once.
CREATE TABLE toolkit_schedules (
    name                  text        PRIMARY KEY,
    definition_name       text        NOT NULL,
    -- 'definition': declared in the YAML of version owner_version (deploys change it);
    -- 'store': made at run time (deploys never touch it).
    owner                 text        NOT NULL CHECK (owner IN ('definition', 'store')),
    owner_version         integer,
    cadence               jsonb       NOT NULL,
    input                 jsonb       NOT NULL DEFAULT '{}'::jsonb,
    tenant                text        NOT NULL DEFAULT 'default',
    tags                  jsonb       NOT NULL DEFAULT '{}'::jsonb,
    overlap               text        NOT NULL DEFAULT 'skip'
        CHECK (overlap IN ('skip', 'buffer_one', 'buffer_all', 'cancel_other', 'allow_all')),
    catchup               text        NOT NULL DEFAULT 'latest'
        CHECK (catchup IN ('none', 'latest', 'all')),
    catchup_window        float8      CHECK (catchup_window > 0),
    pause_after_failures  integer     CHECK (pause_after_failures > 0),
    paused                boolean     NOT NULL DEFAULT false,
    pause_note            text,
    consecutive_failures  integer     NOT NULL DEFAULT 0,
    next_tick             timestamptz NOT NULL,
    -- Ticks that came while a run was live, under buffer_one / buffer_all: started, oldest
    -- first, once no run of the schedule is live.
    buffered              jsonb       NOT NULL DEFAULT '[]'::jsonb,
    fired                 bigint      NOT NULL DEFAULT 0,
    skipped               bigint      NOT NULL DEFAULT 0,
    missed                bigint      NOT NULL DEFAULT 0,
    caught_up             bigint      NOT NULL DEFAULT 0,
    last_tick             timestamptz,
    created_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((catchup = 'all') = (catchup_window IS NOT NULL)),
    CHECK ((owner = 'definition') = (owner_version IS NOT NULL))
);
-- A worker's firing pass: the due schedules of its definitions, by tick time.
CREATE INDEX toolkit_schedules_due ON toolkit_schedules (next_tick) WHERE NOT paused;
-- ... and those with buffered ticks, waiting for their live run to end.
CREATE INDEX toolkit_schedules_buffered ON toolkit_schedules (name)
    WHERE NOT paused AND buffered <> '[]'::jsonb;

-- A delayed start (submit --at / --delay) waits, reason 'start', until its run_at: listed
-- as such, cancelled at once, and not what `toolkit run --until-idle` waits for.
ALTER TABLE toolkit_tasks DROP CONSTRAINT toolkit_tasks_wait_reason_check;
ALTER TABLE toolkit_tasks ADD CONSTRAINT toolkit_tasks_wait_reason_check
    CHECK (wait_reason IN ('timer', 'signal', 'callback', 'child', 'budget', 'limit',
                           'reconciliation', 'start'));

-- A task started by a schedule names it and its tick.
ALTER TABLE toolkit_tasks ADD COLUMN schedule_name text;
ALTER TABLE toolkit_tasks ADD COLUMN scheduled_at timestamptz;
-- The overlap check: is a run of this schedule live? (never reads its ended runs)
CREATE INDEX toolkit_tasks_schedule_live ON toolkit_tasks (schedule_name)
    WHERE schedule_name IS NOT NULL AND state IN ('queued', 'leased', 'waiting');
-- A schedule's runs, newest first (toolkit schedules show, the TaskBrowser's filter).
CREATE INDEX toolkit_tasks_schedule_runs ON toolkit_tasks (schedule_name, id)
    WHERE schedule_name IS NOT NULL;

-- A scheduled run that ends counts for pause_after_failures: a failure adds one to the
-- schedule's consecutive failures (and pauses it at the limit), a success resets them; a
-- cancellation changes nothing. Whatever statement ended the task, in that statement.
CREATE FUNCTION toolkit_count_schedule_outcome() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE toolkit_schedules s
    SET consecutive_failures = CASE WHEN NEW.state = 'failed'
                                    THEN s.consecutive_failures + 1 ELSE 0 END,
        paused = s.paused OR (NEW.state = 'failed'
                              AND s.consecutive_failures + 1 >= s.pause_after_failures),
        pause_note = CASE
            WHEN NOT s.paused AND NEW.state = 'failed'
                 AND s.consecutive_failures + 1 >= s.pause_after_failures
            THEN format('paused after %s consecutive failures (the last: task %s)',
                        s.consecutive_failures + 1, NEW.id)
            ELSE s.pause_note END,
        updated_at = clock_timestamp()
    WHERE s.name = NEW.schedule_name;
    RETURN NULL;
END $$;

CREATE TRIGGER toolkit_tasks_count_schedule_outcome
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.schedule_name IS NOT NULL
          AND NEW.state IN ('succeeded', 'failed')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION toolkit_count_schedule_outcome();
