CREATE TABLE orders (
    id            uuid        PRIMARY KEY,
    status        text        NOT NULL DEFAULT 'created'
                  CHECK (status IN ('created', 'paid', 'reserved', 'rejected')),
    lines         jsonb       NOT NULL,
    reject_reason text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    paid_at       timestamptz,
    settled_at    timestamptz
);

CREATE INDEX orders_status ON orders (status);

-- Every event applied to an order, one row per application. It carries no
-- unique constraint on purpose: the inbox alone keeps a redelivered event
-- from being applied twice, and the chaos harness counts these rows to prove
-- it (and, with the inbox switched off, to catch the double-applies).
CREATE TABLE order_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   uuid        NOT NULL REFERENCES orders (id),
    event      text        NOT NULL,
    message_id text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX order_events_order ON order_events (order_id);
