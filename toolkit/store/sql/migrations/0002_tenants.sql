-- runifold store, schema version 2: tenant admission (DESIGN §2, "Tenant admission").
-- Per-tenant settings and budget amounts, and a claim index keyed by tenant so that the
-- claim can take each tenant's due tasks in due order (fair claim, docs/tenants.md).

-- One row per tenant that ever submitted (every submit registers its tenant). max_active:
-- leased tasks with an unexpired lease at once, NULL for no limit; weight: the tenant's
-- share of each claim batch against the other tenants with due tasks; paused: never
-- claimed from (its tasks stay queued or waiting).
CREATE TABLE toolkit_tenants (
    tenant      text        PRIMARY KEY,
    max_active  integer     CHECK (max_active > 0),
    weight      integer     NOT NULL DEFAULT 1 CHECK (weight > 0),
    paused      boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Budget amounts per tenant and named resource (tokens, cost, calls ...). used counts what
-- was spent plus what is reserved (the reservation SQL keeps it).
CREATE TABLE toolkit_tenant_budgets (
    tenant    text    NOT NULL REFERENCES toolkit_tenants ON DELETE CASCADE,
    resource  text    NOT NULL,
    amount    numeric NOT NULL CHECK (amount >= 0),
    used      numeric NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, resource)
);

INSERT INTO toolkit_tenants (tenant)
SELECT DISTINCT tenant FROM toolkit_tasks
ON CONFLICT DO NOTHING;

-- The claim path, per tenant: a tenant's tasks by when they are due (a queued or waiting
-- task at run_at, a leased one when its lease expires), live rows only. Replaces the
-- version-1 index keyed by due time alone.
DROP INDEX toolkit_tasks_claimable;
CREATE INDEX toolkit_tasks_tenant_due
    ON toolkit_tasks (tenant, (CASE WHEN state = 'leased' THEN lease_expires_at ELSE run_at END), id)
    WHERE state IN ('queued', 'leased', 'waiting');

-- A tenant's leases by expiry: the claim counts a tenant's unexpired leases (max_active, and
-- its share of the leased slots) as one short range of this index.
CREATE INDEX toolkit_tasks_tenant_leased ON toolkit_tasks (tenant, lease_expires_at)
    WHERE state = 'leased';
