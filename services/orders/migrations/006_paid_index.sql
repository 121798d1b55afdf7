-- The auditor (services/auditor) reads the orders paid since its watermark
-- by (paid_at, id). paid_at is set once, when the order is paid: that
-- update is no longer HOT, the ones after it (the answer, the payment)
-- still are.
CREATE INDEX IF NOT EXISTS orders_paid ON orders (paid_at, id) WHERE paid_at IS NOT NULL;
-- On a large table, build it first without blocking writes (CREATE INDEX
-- CONCURRENTLY ... the same definition, then check pg_index.indisvalid):
-- this file then finds it.
