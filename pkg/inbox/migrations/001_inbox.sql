-- One row per (consumer, message) the consumer has finished with: applied,
-- dead-lettered or quarantined. Inserting it in the handler's transaction is
-- what makes a redelivered message a no-op.
CREATE TABLE inbox_messages (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload_sha256 bytea       NOT NULL,
    status         text        NOT NULL DEFAULT 'processed'
                   CHECK (status IN ('processed', 'dead_lettered', 'quarantined')),
    topic          text        NOT NULL DEFAULT '',
    duplicates     int         NOT NULL DEFAULT 0, -- redeliveries suppressed
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- The retention sweep deletes the oldest rows first.
CREATE INDEX inbox_messages_processed_at ON inbox_messages (processed_at);

-- Failed attempts of messages not yet finished with. Written in its own
-- transaction, because the handler's transaction was rolled back.
CREATE TABLE inbox_attempts (
    consumer   text        NOT NULL,
    message_id text        NOT NULL,
    attempts   int         NOT NULL,
    last_error text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Messages that were not applied, with the reason and the full payload, so
-- nothing is lost and an operator can inspect or redrive them.
--   dead_letter:      the handler failed MaxAttempts times, or permanently
--   payload_conflict: an id already applied arrived with a different payload
--   invalid:          no message id, or a payload over the size limit
CREATE TABLE inbox_quarantine (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer          text        NOT NULL,
    message_id        text        NOT NULL,
    kind              text        NOT NULL CHECK (kind IN ('dead_letter', 'payload_conflict', 'invalid')),
    reason            text        NOT NULL,
    attempts          int         NOT NULL DEFAULT 0,
    topic             text        NOT NULL DEFAULT '',
    payload_sha256    bytea       NOT NULL,
    original_sha256   bytea,
    payload           bytea       NOT NULL,
    metadata          jsonb       NOT NULL DEFAULT '{}',
    created_at        timestamptz NOT NULL DEFAULT now()
);

-- A conflicting or invalid payload delivered again is recorded once.
CREATE UNIQUE INDEX inbox_quarantine_once
    ON inbox_quarantine (consumer, kind, message_id, payload_sha256) WHERE kind <> 'dead_letter';
CREATE INDEX inbox_quarantine_consumer ON inbox_quarantine (consumer, created_at);
