-- What a check's Repair did about a finding (repair, in a sentence, and
-- when), or why its last attempt failed (repair_error: asked again next
-- round). A finding that resolves and opens again is repaired again.
ALTER TABLE audit_findings
    ADD COLUMN repair       text,
    ADD COLUMN repaired_at  timestamptz,
    ADD COLUMN repair_error text;
