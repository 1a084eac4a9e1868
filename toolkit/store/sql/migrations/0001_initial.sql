-- runifold store, schema version 1.
-- Time is always the database's: clock_timestamp() / now(), never a worker clock (DESIGN §2).

CREATE TABLE toolkit_definitions (
    name         text        NOT NULL,
    version      integer     NOT NULL CHECK (version > 0),
    digest       text        NOT NULL,
    body         jsonb       NOT NULL,
    source       text,
    deployed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    retired_at   timestamptz,
    PRIMARY KEY (name, version),
    UNIQUE (digest)
);

CREATE TABLE toolkit_tasks (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant             text        NOT NULL DEFAULT 'default',
    definition_name    text        NOT NULL,
    definition_version integer     NOT NULL,
    definition_digest  text        NOT NULL,
    input              jsonb       NOT NULL,
    state              text        NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'leased', 'waiting', 'succeeded', 'failed', 'cancelled')),
    wait_reason        text
        CHECK (wait_reason IN ('timer', 'signal', 'callback', 'child', 'budget', 'limit', 'reconciliation')),
    run_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    checkpoint         jsonb       NOT NULL,
    lease_owner        text,
    lease_token        bigint      NOT NULL DEFAULT 0,
    lease_expires_at   timestamptz,
    attempts           integer     NOT NULL DEFAULT 0,
    result             jsonb,
    error              jsonb,
    cancel_requested   jsonb,
    idempotency_key    text,
    created_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at        timestamptz,
    CHECK ((state = 'waiting') = (wait_reason IS NOT NULL)),
    CHECK ((state = 'leased') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
);
-- No foreign key to toolkit_definitions: a task names its definition by (name, version,
-- digest) for life, and a version may be deleted once no live task references it while
-- finished tasks keep their history.

-- Submit with an idempotency key: one task per (tenant, key).
CREATE UNIQUE INDEX toolkit_tasks_idempotency_key ON toolkit_tasks (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The claim path: tasks by when they are due. A queued or waiting task is due at run_at (a
-- retry, a timer fired, a signal arrived, a signal wait timed out; a wait with no deadline
-- has run_at = 9999-12-31, never); a leased one when its lease expires (recoverable). Only
-- live rows are indexed, so terminal history never slows a claim.
CREATE INDEX toolkit_tasks_claimable
    ON toolkit_tasks ((CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END), id)
    WHERE state IN ('queued', 'leased', 'waiting');
-- Is any task of these definitions queued or leased? (an idle worker's question)
CREATE INDEX toolkit_tasks_active ON toolkit_tasks (definition_digest)
    WHERE state IN ('queued', 'leased');
CREATE INDEX toolkit_tasks_definition ON toolkit_tasks (definition_name, definition_version, state);
CREATE INDEX toolkit_tasks_state ON toolkit_tasks (state, tenant);

-- Effect evidence, append-only: one row per record (started / completed / failed),
-- each written under the fencing token that held the lease (DESIGN §2).
CREATE TABLE toolkit_effect_evidence (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id          bigint      NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    occurrence       text        NOT NULL,
    step             text        NOT NULL,
    handler          text        NOT NULL,
    idempotent       boolean     NOT NULL,
    idempotency_key  text        NOT NULL,
    record           text        NOT NULL CHECK (record IN ('started', 'completed', 'failed')),
    attempt          integer     NOT NULL,
    fencing_token    bigint      NOT NULL,
    worker_id        text        NOT NULL,
    result           jsonb,
    error            jsonb,
    recorded_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX toolkit_effect_evidence_task ON toolkit_effect_evidence (task_id, occurrence, id);

-- Every transition of a task, append-only, with database time, worker and token.
CREATE TABLE toolkit_task_events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id        bigint      NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    kind           text        NOT NULL,
    worker_id      text,
    fencing_token  bigint,
    detail         jsonb,
    at             timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX toolkit_task_events_task ON toolkit_task_events (task_id, id);

CREATE TABLE toolkit_workers (
    worker_id     text PRIMARY KEY,
    pid           integer     NOT NULL,
    host          text        NOT NULL,
    concurrency   integer     NOT NULL,
    lease_seconds     float8  NOT NULL,
    heartbeat_seconds float8  NOT NULL,
    definitions   jsonb       NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at    timestamptz NOT NULL,
    stopped_at    timestamptz
);

-- Signals sent to tasks, kept until a wait consumes them: each exactly once, in order.
CREATE TABLE toolkit_signals (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint      NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    name            text        NOT NULL,
    payload         jsonb,
    sent_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    consumed_at     timestamptz,
    consumed_by     text,
    consumed_token  bigint
);
CREATE INDEX toolkit_signals_pending ON toolkit_signals (task_id, name, id)
    WHERE consumed_at IS NULL;
