-- The domain guard behind the inbox: orders applies one answer per order,
-- to a paid order only. An answer for an order already settled (a second
-- InventoryReserved/Rejected under its own message id, which the inbox
-- cannot recognise as a duplicate) is refused and recorded here with its
-- reason, never applied: order_events holds applied answers only.
CREATE TABLE refusals (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   uuid        NOT NULL,
    message_id text        NOT NULL,
    reason     text        NOT NULL,
    refused_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX refusals_order ON refusals (order_id);
