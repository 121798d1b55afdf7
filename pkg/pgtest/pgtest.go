// Package pgtest gives tests a Postgres server: the one DATABASE_URL names,
// or, without it, a throwaway cluster of its own (initdb and pg_ctl in a temp
// dir, as the postgres OS user when running as root; Postgres fetched from
// Maven Central where none is installed), stopped and removed
// at the end. Each test then takes a database of its own:
//
//	var pg *pgtest.Server
//
//	func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }
//
//	func TestSomething(t *testing.T) {
//		pool := pg.TestDatabase(t) // an empty database, dropped when t ends
//		…
//	}
//
// The library's own tests run on it, and so can the tests of a program that
// imports the library.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgUser is the superuser of throwaway clusters (initdb -U).
const pgUser = "postgres"

// tempPrefix names the temp dirs of throwaway clusters; Start reaps
// dirs with this prefix whose owning process has died (see reapStale).
const tempPrefix = "pgtest-"

// readyTimeout bounds waiting for a server when ctx carries no deadline.
const readyTimeout = 60 * time.Second

// Server is a running Postgres server, either external (DATABASE_URL) or a
// throwaway cluster.
type Server struct {
	// external: the parsed DATABASE_URL; nil for a throwaway cluster.
	ext *url.URL

	// throwaway cluster only.
	binDir  string              // directory holding initdb, pg_ctl, postgres
	dir     string              // temp dir: data/, socket, postgres.log, owner.pid
	port    int                 // TCP port on 127.0.0.1
	cred    *syscall.Credential // run server binaries as this user (set when root)
	mu      sync.Mutex          // serialises Restart and Stop, and guards dropAtStop
	stopped bool

	dropAtStop []string // external only: databases Stop drops (DropAtStop)
}

// Start uses DATABASE_URL when set (returns a Server whose Stop is a
// no-op and which cannot Restart), otherwise it initdb's a throwaway cluster in
// a temp dir (as the postgres OS user when running as root), picks a free TCP
// port on 127.0.0.1, starts it with pg_ctl and waits until it accepts
// connections. The throwaway server keeps fsync and synchronous_commit on,
// listens on 127.0.0.1 only, has max_connections=300, puts its unix socket in
// the temp dir and logs to <tempdir>/postgres.log.
//
// Binaries are looked up in $PG_BIN, then next to pg_ctl on $PATH, then in the
// newest /usr/lib/postgresql/*/bin; where none is installed, RegistryVersion
// is fetched once from Maven Central (PGTEST_MAVEN_REPO names a mirror),
// checked against a pinned hash and kept in PGTEST_CACHE (default: the
// user's cache dir; /var/cache/outbox-inbox for root, whose server runs as
// postgres or, without that user, nobody). The temp dir comes from os.TempDir(): when
// root it must be reachable by the postgres user, and it must be short enough
// for a unix socket path (~100 bytes); the default /tmp is both.
//
// On error everything started so far is stopped and removed.
func Start(ctx context.Context) (_ *Server, err error) {
	if raw := os.Getenv("DATABASE_URL"); raw != "" {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("pgtest: parse DATABASE_URL: %w", err)
		}
		p := &Server{ext: u}
		if err := waitReady(ctx, raw); err != nil {
			return nil, fmt.Errorf("pgtest: DATABASE_URL not reachable: %w", err)
		}
		return p, nil
	}

	binDir, err := findPGBin(ctx)
	if err != nil {
		return nil, err
	}
	p := &Server{binDir: binDir}
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: run every server binary as
		// another user.
		if p.cred, err = serverUser(); err != nil {
			return nil, err
		}
	}
	reapStale(p.binDir, p.cred)

	if p.dir, err = os.MkdirTemp("", tempPrefix); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer func() {
		if err != nil {
			_ = p.Stop() // kills a half-started server and removes the dir
		}
	}()
	// owner.pid lets a later run reap this cluster if we die without Stop.
	if err := os.WriteFile(filepath.Join(p.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := p.chown(p.dir); err != nil {
		return nil, err
	}

	if out, err := p.run(ctx, "initdb", "-D", p.dataDir(), "-U", pgUser, "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	if err := p.appendConf("include_if_exists = 'stack.conf'\n"); err != nil {
		return nil, err
	}

	// The free port may be grabbed by someone else before the server binds
	// it; retry with a fresh port in that case.
	for attempt := 1; ; attempt++ {
		if p.port, err = freePort(); err != nil {
			return nil, err
		}
		if err := p.writeStackConf(); err != nil {
			return nil, err
		}
		out, err := p.run(ctx, "pg_ctl", "start", "-D", p.dataDir(), "-l", p.LogFile(), "-w", "-t", "60")
		if err == nil {
			break
		}
		log, _ := os.ReadFile(p.LogFile())
		if attempt < 3 && strings.Contains(string(log), "could not bind") {
			continue
		}
		return nil, fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n--- %s ---\n%s", err, out, p.LogFile(), tail(log))
	}
	if err := waitReady(ctx, p.URL("postgres")); err != nil {
		return nil, err
	}
	return p, nil
}

// External reports whether the server comes from DATABASE_URL.
func (p *Server) External() bool { return p.ext != nil }

// Dir is the temp dir of a throwaway cluster ("" when external).
func (p *Server) Dir() string { return p.dir }

// LogFile is the server log of a throwaway cluster ("" when external).
func (p *Server) LogFile() string {
	if p.External() {
		return ""
	}
	return filepath.Join(p.dir, "postgres.log")
}

// URL returns the connection URL of database dbname:
// postgres://postgres@127.0.0.1:port/dbname?sslmode=disable for a throwaway
// cluster, DATABASE_URL with its database name replaced when external.
func (p *Server) URL(dbname string) string {
	if p.External() {
		u := *p.ext
		u.Path, u.RawPath = "/"+dbname, ""
		return u.String()
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(pgUser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)),
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// CreateDatabase creates database name if it does not exist yet and returns
// its URL. Concurrent calls for the same name are fine.
func (p *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := p.admin(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("pgtest: lookup database %q: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		// 42P04 duplicate_database, 23505 unique_violation: lost a race
		// with a concurrent CREATE DATABASE of the same name.
		if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")) {
			return "", fmt.Errorf("pgtest: create database %q: %w", name, err)
		}
	}
	return p.URL(name), nil
}

// DropDatabase drops database name, closing any sessions still on it. Tests
// call it when they end, so runs against a DATABASE_URL leave nothing behind.
func (p *Server) DropDatabase(ctx context.Context, name string) error {
	conn, err := p.admin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %q: %w", name, err)
	}
	return nil
}

// admin connects to the database that creates and drops the others: the
// throwaway server's "postgres", or DATABASE_URL's.
func (p *Server) admin(ctx context.Context) (*pgx.Conn, error) {
	url := p.URL("postgres")
	if p.External() {
		url = p.ext.String()
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect: %w", err)
	}
	return conn, nil
}

// Restart crashes the throwaway server (`pg_ctl restart -m immediate`, i.e.
// no shutdown checkpoint, crash recovery on start) and waits until it accepts
// connections again. Existing connections are broken. It fails when external.
func (p *Server) Restart(ctx context.Context) error {
	if p.External() {
		return errors.New("pgtest: cannot restart an external Postgres (DATABASE_URL)")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return errors.New("pgtest: postgres stopped")
	}
	if out, err := p.run(ctx, "pg_ctl", "restart", "-D", p.dataDir(), "-m", "immediate",
		"-l", p.LogFile(), "-w", "-t", "60"); err != nil {
		log, _ := os.ReadFile(p.LogFile())
		return fmt.Errorf("pgtest: pg_ctl restart: %w\n%s\n--- %s ---\n%s", err, out, p.LogFile(), tail(log))
	}
	return waitReady(ctx, p.URL("postgres"))
}

// DropAtStop has Stop drop database name, for callers that have no
// testing.TB to hang DropWhenDone on (examples). A throwaway cluster goes
// with its databases anyway; on DATABASE_URL this leaves nothing behind.
func (p *Server) DropAtStop(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropAtStop = append(p.dropAtStop, name)
}

// Stop shuts the throwaway server down (`pg_ctl stop -m fast`, falling back to
// signalling the postmaster) and removes its temp dir. When external, it only
// drops the databases given to DropAtStop. It is safe to call more than once.
func (p *Server) Stop() error {
	if p == nil {
		return nil
	}
	if p.External() {
		return p.dropRegistered()
	}
	if p.dir == "" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil
	}
	p.stopped = true
	err := stopCluster(p.binDir, p.cred, p.dir, "fast")
	if rmErr := os.RemoveAll(p.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgtest: remove %s: %w", p.dir, rmErr))
	}
	return err
}

// dropRegistered drops, once, the databases given to DropAtStop.
func (p *Server) dropRegistered() error {
	p.mu.Lock()
	names := p.dropAtStop
	p.dropAtStop = nil
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, name := range names {
		errs = append(errs, p.DropDatabase(ctx, name))
	}
	return errors.Join(errs...)
}
