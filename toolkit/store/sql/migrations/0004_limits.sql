-- runifold store, schema version 4: downstream limits (DESIGN §2, "Downstream limits").
-- Named concurrency and rate limits on effects, held fleet-wide in the store
-- (docs/limits.md). Time is the database's: buckets refill by clock_timestamp().

-- One row per named limit. max_concurrency: effect calls inside the limit at once, NULL
-- for no bound; rate_per_second with burst: a token bucket (one token per call, refilled at
-- rate_per_second up to burst), NULL for no rate. per_tenant: each tenant has its own slots
-- and bucket. source: 'app' while the values are the ones an application declared (a
-- worker's start rewrites them), 'operator' once `toolkit limits set` changed them (a
-- worker's start then keeps them).
CREATE TABLE toolkit_limits (
    name             text        PRIMARY KEY,
    max_concurrency  integer     CHECK (max_concurrency > 0),
    rate_per_second  float8      CHECK (rate_per_second > 0),
    burst            float8      CHECK (burst >= 1),
    per_tenant       boolean     NOT NULL DEFAULT false,
    source           text        NOT NULL DEFAULT 'app' CHECK (source IN ('app', 'operator')),
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per limit and scope ('' for a global limit, the tenant for a per-tenant one):
-- the token bucket, and the row every acquirer of that scope locks, so acquisitions of one
-- scope are serialized and each counts the slots the previous ones took.
CREATE TABLE toolkit_limit_buckets (
    name          text        NOT NULL REFERENCES toolkit_limits ON DELETE CASCADE,
    scope         text        NOT NULL,
    tokens        float8      NOT NULL,
    refreshed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (name, scope)
);

-- Concurrency slots. A slot counts only while its task still holds the lease of `token`
-- (leased, unexpired): a crashed worker's slot frees itself at its lease expiry. The fenced
-- write that appends the occurrence's completed or failed evidence deletes the slot in the
-- same statement; rows of lost leases are deleted by the next acquisition of the scope.
CREATE TABLE toolkit_limit_slots (
    task_id      bigint      NOT NULL REFERENCES toolkit_tasks (id) ON DELETE CASCADE,
    occurrence   text        NOT NULL,
    name         text        NOT NULL REFERENCES toolkit_limits ON DELETE CASCADE,
    scope        text        NOT NULL,
    token        bigint      NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task_id, occurrence, name)
);
CREATE INDEX toolkit_limit_slots_scope ON toolkit_limit_slots (name, scope);

-- Tasks waiting for a limit, by limit and due time: a released slot wakes the first of
-- them, and a deferral counts those ahead of it for a token.
CREATE INDEX toolkit_tasks_limit_waits
    ON toolkit_tasks ((checkpoint -> 'wait' ->> 'limit'), run_at)
    WHERE state = 'waiting' AND wait_reason = 'limit';
