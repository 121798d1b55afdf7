-- The stock check's running ledger, in the auditor's own database: per SKU,
-- the units of inventory's reservations and fulfilments up to the check's
-- watermark (audit_watermarks, check 'stock', mark_key '<reservation
-- id>/<fulfilment id>'), moved in the same transaction as the watermark.
CREATE TABLE audit_stock_ledger (
    sku          text   PRIMARY KEY,
    reservations bigint NOT NULL DEFAULT 0,
    fulfilments  bigint NOT NULL DEFAULT 0
);
