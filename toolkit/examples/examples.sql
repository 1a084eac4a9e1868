-- SQL of the example application's own tables (not the toolkit's): the order saga writes
-- them through EffectContext.connection(). Loaded by toolkit/examples/orders.py.

-- name: lock_tables
-- Serialises concurrent creators (CREATE TABLE IF NOT EXISTS alone can race).
SELECT pg_advisory_xact_lock(hashtext('runifold.examples.tables'));

-- name: create_tables
CREATE TABLE IF NOT EXISTS demo_inventory_reservations (
    idempotency_key  text           PRIMARY KEY,
    id               bigint         GENERATED ALWAYS AS IDENTITY UNIQUE,
    order_id         text           NOT NULL,
    customer         text           NOT NULL,
    items            jsonb          NOT NULL,
    units            integer        NOT NULL,
    total            numeric(12, 2) NOT NULL,
    reserved_at      timestamptz    NOT NULL DEFAULT clock_timestamp()
);
-- The payment requests. Deliberately no unique key: every call adds a message, which is
-- why `payments.charge` is declared `idempotent: false`.
CREATE TABLE IF NOT EXISTS demo_outbox (
    id               bigint         GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key  text           NOT NULL,
    topic            text           NOT NULL,
    payload          jsonb          NOT NULL,
    fencing_token    bigint         NOT NULL,
    created_at       timestamptz    NOT NULL DEFAULT clock_timestamp(),
    published_at     timestamptz
);
CREATE INDEX IF NOT EXISTS demo_outbox_idempotency_key ON demo_outbox (idempotency_key);
CREATE TABLE IF NOT EXISTS demo_shipments (
    idempotency_key  text           PRIMARY KEY,
    id               bigint         GENERATED ALWAYS AS IDENTITY UNIQUE,
    order_id         text           NOT NULL,
    ship_to          text           NOT NULL,
    carrier          text           NOT NULL,
    tracking         text           NOT NULL,
    payment_id       text           NOT NULL,
    created_at       timestamptz    NOT NULL DEFAULT clock_timestamp()
);

-- name: upsert_reservation
-- Keyed by the idempotency key: a repeated call updates the same row and returns its id.
INSERT INTO demo_inventory_reservations AS r
    (idempotency_key, order_id, customer, items, units, total)
VALUES (%(key)s, %(order_id)s, %(customer)s, %(items)s, %(units)s, %(total)s)
ON CONFLICT (idempotency_key) DO UPDATE
    SET items = EXCLUDED.items, units = EXCLUDED.units, total = EXCLUDED.total
RETURNING r.id;

-- name: insert_outbox
-- Not idempotent: a second call with the same key writes a second message.
INSERT INTO demo_outbox (idempotency_key, topic, payload, fencing_token)
VALUES (%(key)s, %(topic)s, %(payload)s, %(token)s)
RETURNING id;

-- name: outbox_by_key
-- What a reconciliation looks for: did a call with this idempotency key get through?
SELECT id, payload FROM demo_outbox WHERE idempotency_key = %(key)s ORDER BY id LIMIT 1;

-- name: upsert_shipment
-- Keyed by the idempotency key: a repeated call keeps the first row and returns it.
INSERT INTO demo_shipments AS s
    (idempotency_key, order_id, ship_to, carrier, tracking, payment_id)
VALUES (%(key)s, %(order_id)s, %(ship_to)s, %(carrier)s, %(tracking)s, %(payment_id)s)
ON CONFLICT (idempotency_key) DO UPDATE SET order_id = s.order_id
RETURNING s.id, s.carrier, s.tracking;
