package inboxadmin

import (
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

// Admin is the operator's hand on the inbox tables of one database: every
// consumer's whose inbox lives there.
type Admin struct {
	pool   *pgxpool.Pool
	parked *outboxadmin.Admin // the outbox's parked rows, which bulk actions retry and drop too
}

// New returns an Admin that works through pool.
func New(pool *pgxpool.Pool) *Admin { return &Admin{pool: pool, parked: outboxadmin.New(pool)} }
