-- Continuity (continuity.go): the last number this consumer took in of each
-- key's history (outbox.SequenceMetadata: the producer outbox's stream, and
-- the key's number in it, from 1, set by the producer's PublishTx), and
-- every breach it saw. A row is written
-- in the transaction that records the message's inbox row, so it moves
-- with what the consumer took in, never ahead of it. A role the inbox logs
-- in as needs SELECT, INSERT, UPDATE and DELETE on inbox_key_sequences and
-- INSERT on inbox_continuity_breaches.
CREATE TABLE inbox_key_sequences (
    consumer      text        NOT NULL,
    topic         text        NOT NULL,
    partition_key text        NOT NULL,
    stream        uuid        NOT NULL,
    seq           bigint      NOT NULL, -- the highest number taken in
    missing       int8multirange NOT NULL DEFAULT '{}', -- below seq, never taken in: the gaps still open
    message_id    text        NOT NULL, -- the message that carried seq
    touched_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition_key, stream)
);

-- The sweep deletes the state of keys not heard from within Retention.
CREATE INDEX inbox_key_sequences_touched ON inbox_key_sequences (consumer, touched_at);

-- A breach: a gap (got > expected: got - expected numbers had not arrived)
-- or a rewind (got < expected, under an id this consumer has no inbox row
-- for, and not a number missing: the producer numbered again what it had
-- numbered before); and, beside them, a late message (got < expected, a
-- number missing: it fills a gap reported before). Kept, like the
-- quarantine, for an operator; the metrics count them.
CREATE TABLE inbox_continuity_breaches (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer      text        NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('gap', 'rewind', 'late')),
    topic         text        NOT NULL,
    partition_key text        NOT NULL,
    stream        uuid        NOT NULL,
    expected      bigint      NOT NULL,
    got           bigint      NOT NULL,
    message_id    text        NOT NULL, -- the message that showed it
    previous_id   text        NOT NULL, -- the message that carried expected - 1
    detected_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX inbox_continuity_breaches_consumer ON inbox_continuity_breaches (consumer, kind);
