-- Events (issue 21; docs/events.md): emitted once per key, they start the tasks of the
-- definitions that declare a trigger for them, and are delivered to the tasks whose waits
-- match them by correlation (equality of payload fields with values of the task's input).

-- An event of a tenant. `key` de-duplicates emits: a second emit of (tenant, name, key) is
-- the first event, until retention prunes it. `started` and `delivered` record what the emit
-- did (task ids: started, delivered to, cancelled), for `toolkit events list` and `toolkit
-- show`.
CREATE TABLE toolkit_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant      text        NOT NULL,
    name        text        NOT NULL,
    key         text,
    payload     jsonb,
    emitted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    started     bigint[]    NOT NULL DEFAULT '{}',
    delivered   bigint[]    NOT NULL DEFAULT '{}',
    cancelled   bigint[]    NOT NULL DEFAULT '{}'
);
CREATE UNIQUE INDEX toolkit_events_key ON toolkit_events (tenant, name, key)
    WHERE key IS NOT NULL;
CREATE INDEX toolkit_events_name_time ON toolkit_events (tenant, name, emitted_at);
CREATE INDEX toolkit_events_time ON toolkit_events (emitted_at);
-- `toolkit show` finds the event that started a task.
CREATE INDEX toolkit_events_started ON toolkit_events USING gin (started);
CREATE INDEX toolkit_events_cancelled ON toolkit_events USING gin (cancelled);
-- A task subscribing finds the events of its match emitted since it started: a containment
-- of the match values in the payload, answered by this index.
CREATE INDEX toolkit_events_payload ON toolkit_events USING gin (payload jsonb_path_ops);

-- A task's correlated waits, and its cancel_on: event `event` of its tenant whose payload
-- fields `fields` (a sorted JSON array of names) equal `match` (a JSON array of the values,
-- in that order); `cancels`: the event cancels the task rather than reaching a wait. An
-- emit looks its subscribers up by (tenant, event, fields, match): an index lookup, never a
-- scan of the waiting tasks.
CREATE TABLE toolkit_event_subscriptions (
    tenant   text    NOT NULL,
    event    text    NOT NULL,
    fields   text    NOT NULL,
    match    text    NOT NULL,
    task_id  bigint  NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    cancels  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (tenant, event, fields, match, task_id, cancels)
);
CREATE INDEX toolkit_event_subscriptions_task ON toolkit_event_subscriptions (task_id);

-- The field lists subscriptions of each event match on: an emit computes one match per
-- shape from its payload.
CREATE TABLE toolkit_event_shapes (
    event   text NOT NULL,
    fields  text NOT NULL,
    PRIMARY KEY (event, fields)
);

-- The definitions whose newest registered version has a trigger for an event (`triggers`)
-- or declares its payload schema (`declares`, the definition's `events:`): what an emit of
-- the event reads, by an index lookup on the event's name.
CREATE TABLE toolkit_event_uses (
    event            text    NOT NULL,
    definition_name  text    NOT NULL,
    version          integer NOT NULL,
    triggers         boolean NOT NULL,
    declares         boolean NOT NULL,
    PRIMARY KEY (event, definition_name)
);
CREATE INDEX toolkit_event_uses_definition ON toolkit_event_uses (definition_name);

-- An event delivered to a task is stored as a signal (name `event:NAME`), taken by the wait
-- that matches it like any signal; event_id makes its delivery idempotent per task.
ALTER TABLE toolkit_signals ADD COLUMN event_id bigint;
CREATE UNIQUE INDEX toolkit_signals_event ON toolkit_signals (task_id, event_id)
    WHERE event_id IS NOT NULL;
