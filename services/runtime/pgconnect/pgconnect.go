// Package pgconnect opens the pool a long-running process of the reference
// system (a service, the payment provider) works with: one that waits for
// its database to answer at start, and notices a vanished database host
// within seconds.
package pgconnect

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Open opens a pool on url (at least 20 connections) and waits, up to about
// 30 attempts a second apart, for the database to answer, so a process
// started beside its database does not crash-loop.
func Open(ctx context.Context, url string, log *slog.Logger) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the database URL: %w", err)
	}
	pcfg.MaxConns = max(pcfg.MaxConns, 20)
	// A database host that vanished (no FIN, no RST) is found within ~11 s,
	// not the kernel's two hours, so a relay or a handler waiting on it
	// fails and retries instead of hanging (the relay sets the same on the
	// server's side: see outbox.Relay).
	pcfg.ConnConfig.DialFunc = (&net.Dialer{
		Timeout:         10 * time.Second,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3},
	}).DialContext
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("creating pool: %w", err)
	}
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = pool.Ping(pctx)
		cancel()
		if err == nil {
			return pool, nil
		}
		if attempt == 30 || ctx.Err() != nil {
			pool.Close()
			return nil, fmt.Errorf("connecting to database: %w", err)
		}
		log.Warn("database not ready; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
