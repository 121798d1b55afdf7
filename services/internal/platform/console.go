package platform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/console"
	"github.com/outboxref/outbox-inbox/services/runtime/httpserve"
)

// consoleServer is the service's web console (pkg/console) on CONSOLE_ADDR.
type consoleServer struct {
	con *console.Console
	srv *http.Server
	ln  net.Listener
	log *slog.Logger
}

// newConsole returns the console CONSOLE_ADDR asks for, listening; nil
// when it is unset. Beyond loopback it needs logins (CONSOLE_USERS).
func newConsole(cfg Config, svc Service, pool *pgxpool.Pool, log *slog.Logger) (*consoleServer, error) {
	if cfg.ConsoleAddr == "" {
		return nil, nil
	}
	users, err := console.ParseUsers(cfg.ConsoleUsers)
	if err != nil {
		return nil, fmt.Errorf("CONSOLE_USERS: %w", err)
	}
	if len(users) == 0 && !httpserve.Loopback(cfg.ConsoleAddr) {
		return nil, fmt.Errorf("CONSOLE_ADDR %q listens beyond loopback and the console would retry and drop messages for anyone who reaches it: "+
			"set CONSOLE_USERS (name:role:secret, role viewer or operator) or listen on 127.0.0.1", cfg.ConsoleAddr)
	}
	if cfg.ConsoleKey != "" && len(cfg.ConsoleKey) < 32 {
		return nil, fmt.Errorf("CONSOLE_KEY: %d bytes; at least 32", len(cfg.ConsoleKey))
	}
	con, err := console.New(console.Config{Pool: pool, Title: svc.Name, Users: users, Key: []byte(cfg.ConsoleKey), Logger: log})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.ConsoleAddr)
	if err != nil {
		return nil, fmt.Errorf("console: listening on %s: %w", cfg.ConsoleAddr, err)
	}
	srv := httpserve.Server(cfg.ConsoleAddr, con, httpserve.Options{AllowedHosts: cfg.HTTPAllowedHosts, OwnLogins: true})
	logins := "loopback clients only"
	if len(users) > 0 {
		logins = fmt.Sprintf("%d logins", len(users))
	}
	log.Info("console", "addr", ln.Addr().String(), "logins", logins)
	return &consoleServer{con: con, srv: srv, ln: ln, log: log}, nil
}

// run serves the console and runs its bulk actions until ctx ends.
func (c *consoleServer) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	c.srv.BaseContext = func(net.Listener) context.Context { return gctx } // a page's queries end with the service
	g.Go(func() error {
		if err := c.srv.Serve(c.ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("console: %w", err)
		}
		return nil
	})
	g.Go(func() error { return c.con.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.srv.Shutdown(shutdownCtx); err != nil {
			c.log.Warn("console: pages still open at shutdown were cut off", "error", err)
		}
		return nil
	})
	return g.Wait()
}
