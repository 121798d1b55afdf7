-- The domain guard behind the inbox: inventory decides each order once.
-- The inbox keeps a redelivered message from being applied twice; this key
-- keeps a second OrderPaid for the same order (a fresh message id: a forged
-- or replayed event, a producer that published twice) from reserving twice.
-- The handler looks decisions up first and refuses such an event; the
-- primary key makes a second decision impossible even if that check is
-- bypassed (two consumers racing on the same order: one commits, the other
-- fails and is retried into a refusal).
CREATE TABLE decisions (
    order_id   text        PRIMARY KEY,
    decision   text        NOT NULL CHECK (decision IN ('reserved', 'rejected')),
    message_id text        NOT NULL,
    decided_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO decisions (order_id, decision, message_id, decided_at)
SELECT DISTINCT ON (order_id) order_id, 'reserved', message_id, created_at FROM reservations ORDER BY order_id, id
ON CONFLICT DO NOTHING;
INSERT INTO decisions (order_id, decision, message_id, decided_at)
SELECT DISTINCT ON (order_id) order_id, 'rejected', message_id, created_at FROM rejections ORDER BY order_id, id
ON CONFLICT DO NOTHING;

-- Events the guard refused, with the reason: acknowledged, never applied.
CREATE TABLE refusals (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   text        NOT NULL,
    message_id text        NOT NULL,
    reason     text        NOT NULL,
    refused_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX refusals_order ON refusals (order_id);
