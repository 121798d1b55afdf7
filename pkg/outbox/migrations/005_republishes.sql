-- Who asked the outbox to send published rows again, and what
-- (outboxadmin.Admin.Republish, outboxctl republish): the rows of a topic
-- published in [published_from, published_to), of one partition key when
-- partition_key is set. A republish marks those rows unpublished; the relay
-- sends them again under their message ids, in their order, and each
-- consumer's inbox suppresses what it had applied (docs/broker-loss.md).
-- The operator's role needs INSERT on it and UPDATE on outbox_messages.
CREATE TABLE outbox_republishes (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic          text        NOT NULL,
    partition_key  text,
    published_from timestamptz NOT NULL,
    published_to   timestamptz NOT NULL CHECK (published_to > published_from),
    row_count      bigint      NOT NULL,
    requested_by   text        NOT NULL,
    reason         text        NOT NULL,
    requested_at   timestamptz NOT NULL DEFAULT now()
);
