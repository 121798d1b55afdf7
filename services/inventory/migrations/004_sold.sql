-- An order ends when its payment is captured (orders publishes
-- OrderCaptured): its reserved units are then sold, no longer held. So a
-- SKU's reserved units are those of the orders still open and fall back as
-- orders end, and sold counts what every ended order took, over the SKU's
-- life (a bigint, for the reason migration 003 gives).
--
-- Orders captured before this migration never had an OrderCaptured
-- published: their units stay counted in reserved.
ALTER TABLE stock ADD COLUMN sold bigint NOT NULL DEFAULT 0 CHECK (sold >= 0);

-- One row per application, per SKU, as reservations has: no unique
-- constraint, so that the chaos harness can count a double application.
CREATE TABLE fulfilments (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   text        NOT NULL,
    sku        text        NOT NULL REFERENCES stock (sku),
    quantity   int         NOT NULL CHECK (quantity > 0),
    message_id text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX fulfilments_order ON fulfilments (order_id);

-- The domain guard: an order ends once, and only an order inventory
-- reserved ends. fulfilled_by is the message that ended it.
ALTER TABLE decisions
    ADD COLUMN fulfilled_by text,
    ADD COLUMN fulfilled_at timestamptz,
    ADD CONSTRAINT decisions_fulfil_reserved CHECK (fulfilled_by IS NULL OR decision = 'reserved');
