package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/services/runtime/httpserve"
	"github.com/outboxref/outbox-inbox/services/runtime/pgconnect"
)

// Run connects to the provider's database (waiting for it), applies its
// migrations, and serves the API on cfg.HTTPAddr until ctx ends; then it
// stops taking requests, lets those in flight finish (up to 10s) and
// returns. The key sweep runs every SweepInterval meanwhile.
func Run(ctx context.Context, cfg Config) error {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := cfg.Logger.With("service", "provider", "instance", cfg.Instance)
	cfg.Logger = log
	pool, err := pgconnect.Open(ctx, cfg.DatabaseURL, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	p, err := New(pool, cfg)
	if err != nil {
		return err
	}
	if err := httpserve.CheckExposure("HTTP_ADDR", cfg.HTTPAddr, cfg.HTTPToken); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.HTTPAddr, err)
	}
	srv := httpserve.Server(cfg.HTTPAddr, p.Handler(), httpserve.Options{Token: cfg.HTTPToken}) // reads HTTP_ALLOWED_HOSTS

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	g.Go(func() error { return p.runSweep(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		p.stop()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	})
	log.Info("started", "http", ln.Addr().String(), "seed", p.Seed(),
		"latency_min", cfg.LatencyMin, "latency_max", cfg.LatencyMax, "fail_rate", cfg.FailRate,
		"lost_response_rate", cfg.LostResponseRate, "lost_response_delay", cfg.LostResponseDelay,
		"decline_amount", cfg.DeclineAmount, "key_ttl", cfg.KeyTTL, "key_lock_timeout", cfg.KeyLockTimeout)
	err = g.Wait()
	log.Info("stopped", "err", err)
	return err
}

// runSweep deletes expired keys every SweepInterval until ctx ends. A
// failed sweep is logged and tried again at the next tick: expiry is also
// checked when a key is read, so a late sweep only costs disk.
func (p *Provider) runSweep(ctx context.Context) error {
	t := time.NewTicker(p.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := p.Sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			p.log.Warn("key sweep failed", "err", err)
		case n > 0:
			p.log.Info("swept expired idempotency keys", "deleted", n)
		}
	}
}
