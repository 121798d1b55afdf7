-- Effects: one row per call to the world outside the database (a payment
-- capture, an e-mail), written in the same transaction as the domain change
-- that asks for it, so the intent exists if and only if that change
-- committed. (kind, key) is unique: the key is the call's idempotency key,
-- and asking twice for one effect records one intent.
CREATE TABLE effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text        NOT NULL,
    key        text        NOT NULL,
    payload    bytea       NOT NULL,
    state      text        NOT NULL DEFAULT 'pending'
               CHECK (state IN ('pending', 'done', 'failed')),
    -- Calls started, counted when a runner claims the effect.
    attempts   int         NOT NULL DEFAULT 0,
    -- A pending effect is called once due_at has passed: at once when it is
    -- new, after the backoff when a call failed, after the lease when a
    -- runner claimed it (a runner that dies mid-call leaves it to another).
    due_at     timestamptz NOT NULL DEFAULT now(),
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    done_at    timestamptz,
    UNIQUE (kind, key)
);

-- The runner's claim reads the due pending effects of its kind.
CREATE INDEX effects_due ON effects (kind, due_at) WHERE state = 'pending';
