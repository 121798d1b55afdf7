package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Standby plays a streaming standby of the server: a physical replication
// connection, on a replication slot of its own, that reports, as a standby
// does after each flush, the position it flushed: whatever the test says.
// The server's walsender and slot are real, so what the primary sees
// (pg_replication_slots, pg_stat_replication) is what a real standby that
// lags by as much would show; the WAL it is sent is not kept.
type Standby struct {
	t    testing.TB
	pool *pgxpool.Pool
	conn *pgconn.PgConn
	Slot string
}

var standbys atomic.Int64

// StartStandby starts a Standby that holds what the server flushed so far,
// through pool (any database of the server), until t ends.
func (p *Server) StartStandby(t testing.TB, pool *pgxpool.Pool) *Standby {
	t.Helper()
	ctx := t.Context()
	slot := fmt.Sprintf("pgtest_standby_%d_%d", os.Getpid(), standbys.Add(1)) // unique on a server test processes share
	if _, err := pool.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, slot); err != nil {
		t.Fatalf("pgtest: creating the standby's slot: %v", err)
	}
	u, err := url.Parse(p.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", "true") // a physical walsender
	u.RawQuery = q.Encode()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("pgtest: the standby's replication connection: %v", err)
	}
	s := &Standby{t: t, pool: pool, conn: conn, Slot: slot}
	t.Cleanup(func() {
		conn.Close(context.Background()) //nolint:errcheck // its walsender ends with it
		// The slot goes once its walsender is gone.
		for range 100 {
			if _, err := pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot); err == nil {
				return
			}
		}
	})
	start := s.primaryFlushed()
	if err := pglogrepl.StartReplication(ctx, conn, slot, start, pglogrepl.StartReplicationOptions{Mode: pglogrepl.PhysicalReplication}); err != nil {
		t.Fatalf("pgtest: starting replication: %v", err)
	}
	s.Flushed(start)
	return s
}

// primaryFlushed is where the server's WAL is flushed now.
func (s *Standby) primaryFlushed() pglogrepl.LSN {
	s.t.Helper()
	var lsn pglogrepl.LSN
	if err := s.pool.QueryRow(s.t.Context(), `SELECT pg_current_wal_flush_lsn()::text`).Scan(&lsn); err != nil {
		s.t.Fatalf("pgtest: reading the flush position: %v", err)
	}
	return lsn
}

// Flushed reports lsn flushed. The walsender takes it in at its next turn,
// as it takes a real standby's report.
func (s *Standby) Flushed(lsn pglogrepl.LSN) {
	s.t.Helper()
	err := pglogrepl.SendStandbyStatusUpdate(s.t.Context(), s.conn,
		pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn})
	if err != nil {
		s.t.Fatalf("pgtest: reporting the standby's position: %v", err)
	}
}

// CatchUp reports flushed everything the server flushed by now, and
// returns that position.
func (s *Standby) CatchUp() pglogrepl.LSN {
	s.t.Helper()
	lsn := s.primaryFlushed()
	s.Flushed(lsn)
	return lsn
}
