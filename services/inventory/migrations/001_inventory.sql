-- Stock per SKU. The CHECK constraints make negative stock impossible, not
-- merely unlikely: a handler bug would fail its transaction instead.
CREATE TABLE stock (
    sku        text        PRIMARY KEY,
    available  int         NOT NULL CHECK (available >= 0),
    reserved   int         NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per reserved line. There is deliberately no unique constraint on
-- order_id: the inbox alone keeps a redelivered OrderPaid from reserving
-- twice, and the chaos harness counts these rows to prove it (and, with the
-- inbox switched off, to catch the double-applies).
CREATE TABLE reservations (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   text        NOT NULL,
    sku        text        NOT NULL REFERENCES stock (sku),
    quantity   int         NOT NULL CHECK (quantity > 0),
    message_id text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX reservations_order ON reservations (order_id);

-- Orders that could not be reserved, one row per application (same reasoning).
CREATE TABLE rejections (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   text        NOT NULL,
    reason     text        NOT NULL,
    message_id text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX rejections_order ON rejections (order_id);
