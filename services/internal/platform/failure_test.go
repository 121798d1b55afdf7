package platform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestDatabaseUnavailable: what says the database was out of reach is told
// apart from what it refused.
func TestDatabaseUnavailable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true},  // admin_shutdown: a restart
		{&pgconn.PgError{Code: "57P03"}, true},  // cannot_connect_now: starting up
		{&pgconn.PgError{Code: "08006"}, true},  // connection_failure
		{&pgconn.PgError{Code: "53300"}, true},  // too_many_connections
		{&pgconn.PgError{Code: "25006"}, true},  // read_only_sql_transaction: a demoted primary, after a failover
		{&pgconn.PgError{Code: "25P02"}, false}, // in_failed_sql_transaction: the caller's own mistake
		{&pgconn.PgError{Code: "23505"}, false}, // unique_violation: refused, not unavailable
		{&pgconn.PgError{Code: "40001"}, false}, // serialization_failure
		{&pgconn.PgError{Code: "08P01"}, false}, // protocol_violation: a client's bug
		{fmt.Errorf("paying: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{fmt.Errorf("reading: %w", syscall.ECONNRESET), true},
		// A deadline or a cancellation against a database that is up (a
		// statement behind a lock, leaked connections) is not an outage.
		{fmt.Errorf("paying: %w", context.DeadlineExceeded), false},
		{context.Canceled, false},
		{&net.OpError{Op: "read", Net: "tcp", Err: context.DeadlineExceeded}, false},
		{errors.New("order not found"), false},
		{nil, false},
	} {
		if got := DatabaseUnavailable(c.err); got != c.want {
			t.Errorf("DatabaseUnavailable(%v) = %t, want %t", c.err, got, c.want)
		}
	}
}
