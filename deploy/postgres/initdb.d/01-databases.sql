-- Run once, by the postgres image's entrypoint, when the data volume is new:
-- one database per service (each service migrates its own at start).
CREATE DATABASE orders;
CREATE DATABASE inventory;
-- The payment provider stand-in keeps its ledger in a database of its own.
CREATE DATABASE provider;
-- The auditor (services/auditor) keeps its watermarks, findings and stock
-- ledger in its own; it only reads the services'.
CREATE DATABASE audit;
