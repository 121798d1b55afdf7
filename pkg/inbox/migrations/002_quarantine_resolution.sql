-- What an operator did with a quarantined or dead-lettered message, kept on
-- the row as its audit record (see admin.go):
--   redriven:  written back through the outbox under its original id, to be
--              applied by the (fixed) consumer;
--   discarded: judged not worth applying, by whom and why.
-- A row is resolved once; unresolved rows are the operator's to-do list.
ALTER TABLE inbox_quarantine
    ADD COLUMN resolved_at     timestamptz,
    ADD COLUMN resolution      text CHECK (resolution IN ('redriven', 'discarded')),
    ADD COLUMN resolved_by     text,
    ADD COLUMN resolution_note text,
    ADD CONSTRAINT inbox_quarantine_resolution_complete
        CHECK ((resolved_at IS NULL) = (resolution IS NULL) AND (resolution IS NULL) = (resolved_by IS NULL));

-- The open rows, for inboxctl list and the dashboard.
CREATE INDEX inbox_quarantine_open ON inbox_quarantine (consumer, created_at) WHERE resolved_at IS NULL;
