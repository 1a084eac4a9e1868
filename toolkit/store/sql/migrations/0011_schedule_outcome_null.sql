-- A failed run of a schedule without pause_after_failures ended in an error (issue 17).
--
-- 0010's trigger computed `paused = s.paused OR (failed AND count >= s.pause_after_failures)`:
-- with no pause_after_failures that is NULL, the NOT NULL column refused it, and with it the
-- statement that ended the task. A NULL limit now means "never pause".
CREATE OR REPLACE FUNCTION toolkit_count_schedule_outcome() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    pauses boolean;
BEGIN
    SELECT NEW.state = 'failed' AND s.pause_after_failures IS NOT NULL
           AND s.consecutive_failures + 1 >= s.pause_after_failures
    INTO pauses
    FROM toolkit_schedules s
    WHERE s.name = NEW.schedule_name;
    UPDATE toolkit_schedules s
    SET consecutive_failures = CASE WHEN NEW.state = 'failed'
                                    THEN s.consecutive_failures + 1 ELSE 0 END,
        paused = s.paused OR coalesce(pauses, false),
        pause_note = CASE
            WHEN NOT s.paused AND coalesce(pauses, false)
            THEN format('paused after %s consecutive failures (the last: task %s)',
                        s.consecutive_failures + 1, NEW.id)
            ELSE s.pause_note END,
        updated_at = clock_timestamp()
    WHERE s.name = NEW.schedule_name;
    RETURN NULL;
END $$;
