-- An order is updated twice in its life (paid, then reserved or rejected).
-- With no index on status and free room on each page, both updates are HOT:
-- Postgres rewrites the row in place on its page and touches no index.
-- Counting orders by status stays a sequential scan either way.
DROP INDEX IF EXISTS orders_status;
ALTER TABLE orders SET (fillfactor = 50);
