-- runifold store, schema version 6: a tenant budget knows what of its use is reserved, and
-- a task that ends holding a reservation returns it (docs/composition.md, "Budgets").

-- reserved: the part of used that live tasks' parallel and map steps hold as reservations
-- (used - reserved is what was spent for good). A reservation that does not fit now waits
-- only while the reserved part, once returned, would make room.
ALTER TABLE toolkit_tenant_budgets
    ADD COLUMN reserved numeric NOT NULL DEFAULT 0 CHECK (reserved >= 0);

UPDATE toolkit_tenant_budgets b
SET reserved = r.amount
FROM (
    SELECT t.tenant, k.key AS resource, sum(k.value::numeric) AS amount
    FROM toolkit_tasks t
    CROSS JOIN LATERAL jsonb_each_text(t.checkpoint #> '{fanout,reserved}') AS k
    WHERE t.state IN ('queued', 'leased', 'waiting')
      AND jsonb_typeof(t.checkpoint #> '{fanout,reserved}') = 'object'
    GROUP BY t.tenant, k.key
) r
WHERE b.tenant = r.tenant AND b.resource = r.resource;

-- A task that ends (succeeded, failed, cancelled) while its checkpoint still records a
-- reservation (cancelled mid-step, by request or by its worker, or failed by the engine)
-- returns what it did not spend of it: whatever path ended it, in the statement that did.
-- The engine releases a reservation itself when its step ends normally (the checkpoint
-- then records none).
CREATE FUNCTION toolkit_return_reservation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- held: what the row really holds of it (a budget set after the reservation was taken
    -- holds none); the spend counts either way.
    UPDATE toolkit_tenant_budgets b
    SET used = b.used - least(r.value::numeric, b.reserved)
               + coalesce((NEW.checkpoint #>> ARRAY['fanout', 'spent', r.key])::numeric, 0),
        reserved = b.reserved - least(r.value::numeric, b.reserved)
    FROM jsonb_each_text(NEW.checkpoint #> '{fanout,reserved}') AS r
    WHERE b.tenant = NEW.tenant AND b.resource = r.key;
    RETURN NULL;
END $$;

CREATE TRIGGER toolkit_tasks_return_reservation
    AFTER UPDATE OF state ON toolkit_tasks
    FOR EACH ROW
    WHEN (NEW.state IN ('succeeded', 'failed', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled')
          AND jsonb_typeof(NEW.checkpoint #> '{fanout,reserved}') = 'object')
    EXECUTE FUNCTION toolkit_return_reservation();
