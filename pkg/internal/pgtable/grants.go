// Package pgtable holds what the outbox's and the inbox's conversions to
// partitioned tables share.
package pgtable

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CopyGrants grants on the table to every role, in tx, what it holds on
// the table from (the one a conversion renamed and attached), on the whole
// table and on each of its columns that to has too: CREATE TABLE
// ... LIKE copies no privileges, and access through a partitioned table is
// checked on it alone, so a role that producers or consumers log in as
// would otherwise lose its access at the cut-over.
func CopyGrants(ctx context.Context, tx pgx.Tx, from, to string) error {
	rows, err := tx.Query(ctx, `
		SELECT format('GRANT %s ON %s TO %s%s', a.privilege_type, $2::text,
			CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
			CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
		FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
		WHERE c.oid = $1::regclass
		UNION ALL
		SELECT format('GRANT %s (%I) ON %s TO %s%s', a.privilege_type, att.attname, $2::text,
			CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
			CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
		FROM pg_attribute att CROSS JOIN LATERAL aclexplode(att.attacl) a
		WHERE att.attrelid = $1::regclass AND att.attnum > 0 AND NOT att.attisdropped
		  AND EXISTS (SELECT 1 FROM pg_attribute t
		              WHERE t.attrelid = $2::regclass AND t.attname = att.attname AND t.attnum > 0 AND NOT t.attisdropped)`,
		pgx.Identifier{from}.Sanitize(), pgx.Identifier{to}.Sanitize())
	if err != nil {
		return fmt.Errorf("reading the grants on %s: %w", from, err)
	}
	grants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("reading the grants on %s: %w", from, err)
	}
	for _, g := range grants {
		if _, err := tx.Exec(ctx, g); err != nil {
			return fmt.Errorf("%s: %w", g, err)
		}
	}
	return nil
}
