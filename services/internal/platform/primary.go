package platform

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A replicated database fails over: for a while no primary answers, then
// another server is the primary. The service looks at its database every
// second, logs each such change once (docs/failover.md), and its /readyz
// answers 503 while no primary takes writes (probePrimary: a connection
// that reaches a replica, a demoted primary, is read-only, and says so).

// primaryState is what one look at the database found.
type primaryState struct {
	server string // the primary's address, as it gives it; "" when none answered
	err    error  // why none did
}

// probePrimary asks the database, through the pool, whether the server it
// reaches takes writes, and which server that is.
func probePrimary(ctx context.Context, pool *pgxpool.Pool) primaryState {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var replica bool
	var server string
	err := pool.QueryRow(ctx, `SELECT pg_is_in_recovery(), coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'local socket')`).Scan(&replica, &server)
	switch {
	case err != nil:
		return primaryState{err: err}
	case replica:
		return primaryState{err: fmt.Errorf("%s is a read-only replica", server)}
	}
	return primaryState{server: server}
}

// primaryWatch remembers the last look and logs the changes.
type primaryWatch struct {
	log *slog.Logger

	mu      sync.Mutex
	last    primaryState
	primary string    // the last server that answered as the primary
	since   time.Time // when the primary was lost; zero while one answers
	seen    bool
}

// up reports whether the last look found a primary.
func (w *primaryWatch) up() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen && w.last.err == nil
}

// note records one look at now, and logs a change: the primary lost, or a
// primary back (a failover when it is another server).
func (w *primaryWatch) note(st primaryState, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, first := w.last, !w.seen
	w.last, w.seen = st, true
	switch {
	case st.err != nil && (first || prev.err == nil):
		w.since = now
		w.log.Error("database: no primary answers (failing over, or down): writes wait", "err", st.err, "last_primary", w.primary)
	case st.err == nil && !first && prev.err != nil:
		lost := now.Sub(w.since).Round(100 * time.Millisecond)
		w.since = time.Time{}
		if w.primary != "" && w.primary != st.server {
			w.log.Warn("database: failed over: a new primary answers", "primary", st.server, "was", w.primary, "without_primary", lost.String())
		} else {
			w.log.Info("database: the primary answers again", "primary", st.server, "without_primary", lost.String())
		}
	case st.err == nil && !first && prev.server != st.server:
		w.log.Warn("database: failed over: a new primary answers", "primary", st.server, "was", prev.server)
	}
	if st.err == nil {
		w.primary = st.server
	}
}

// run looks every interval until ctx ends.
func (w *primaryWatch) run(ctx context.Context, pool *pgxpool.Pool, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		w.note(probePrimary(ctx, pool), time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
