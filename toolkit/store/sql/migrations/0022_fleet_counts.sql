-- The fleet gauges' counts, counted by one worker of the fleet at a time (issue 22).
--
-- toolkit_definition_unavailable_tasks and toolkit_tasks_held are the whole fleet's; every
-- worker counted them every 15 s, each count reading every live task: with 1,000,000 parked
-- timers and 50 workers, most of a core of the server for the same numbers. One row keeps
-- the last counts and when they were counted; the worker whose refresh finds them older
-- than the refresh interval counts again (refresh_fleet_counts), the others read them.
CREATE TABLE toolkit_fleet_counts (
    one          boolean     PRIMARY KEY DEFAULT true CHECK (one),
    refreshed_at timestamptz NOT NULL DEFAULT '-infinity',
    unavailable  jsonb       NOT NULL DEFAULT '[]',
    held         jsonb       NOT NULL DEFAULT '[]'
);
INSERT INTO toolkit_fleet_counts DEFAULT VALUES;
