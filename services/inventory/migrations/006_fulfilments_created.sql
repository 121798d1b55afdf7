-- The auditor (services/auditor) reads the sales made since its watermark
-- by (created_at, id): in the order of their transactions' start, so a sale
-- whose transaction commits late is still ahead of the watermark. Insert
-- only: fulfilments are never updated.
CREATE INDEX IF NOT EXISTS fulfilments_created ON fulfilments (created_at, id);
-- On a large table, build it first without blocking writes (CREATE INDEX
-- CONCURRENTLY ... the same definition, then check pg_index.indisvalid):
-- this file then finds it.
