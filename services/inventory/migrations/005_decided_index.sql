-- The auditor (services/auditor) reads the decisions made since its
-- watermark by (decided_at, order_id). decided_at is never updated, so the
-- update that ends an order (fulfilled_by) stays as it was.
CREATE INDEX IF NOT EXISTS decisions_decided ON decisions (decided_at, order_id);
-- On a large table, build it first without blocking writes (CREATE INDEX
-- CONCURRENTLY ... the same definition, then check pg_index.indisvalid):
-- this file then finds it.
