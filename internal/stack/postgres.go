package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxref/outbox-inbox/internal/procs"
)

// pgUser is the superuser of throwaway clusters (initdb -U).
const pgUser = "postgres"

// tempPrefix names the temp dirs of throwaway clusters; StartPostgres reaps
// dirs with this prefix whose owning process has died (see reapStale).
const tempPrefix = "stack-pg-"

// readyTimeout bounds waiting for a server when ctx carries no deadline.
const readyTimeout = 60 * time.Second

// Postgres is a running Postgres server, either external (DATABASE_URL) or a
// throwaway cluster.
type Postgres struct {
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

// StartPostgres uses DATABASE_URL when set (returns a Postgres whose Stop is a
// no-op and which cannot Restart), otherwise it initdb's a throwaway cluster in
// a temp dir (as the postgres OS user when running as root), picks a free TCP
// port on 127.0.0.1, starts it with pg_ctl and waits until it accepts
// connections. The throwaway server keeps fsync and synchronous_commit on,
// listens on 127.0.0.1 only, has max_connections=300, puts its unix socket in
// the temp dir and logs to <tempdir>/postgres.log.
//
// Binaries are looked up in $PG_BIN, then next to pg_ctl on $PATH, then in the
// newest /usr/lib/postgresql/*/bin. The temp dir comes from os.TempDir(): when
// root it must be reachable by the postgres user, and it must be short enough
// for a unix socket path (~100 bytes); the default /tmp is both.
//
// On error everything started so far is stopped and removed.
func StartPostgres(ctx context.Context) (_ *Postgres, err error) {
	if raw := os.Getenv("DATABASE_URL"); raw != "" {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("stack: parse DATABASE_URL: %w", err)
		}
		p := &Postgres{ext: u}
		if err := waitReady(ctx, raw); err != nil {
			return nil, fmt.Errorf("stack: DATABASE_URL not reachable: %w", err)
		}
		return p, nil
	}

	binDir, err := findPGBin()
	if err != nil {
		return nil, err
	}
	p := &Postgres{binDir: binDir}
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: run every server binary as postgres.
		if p.cred, err = lookupCred(pgUser); err != nil {
			return nil, fmt.Errorf("stack: running as root needs a %q OS user: %w", pgUser, err)
		}
	}
	reapStale(p.binDir, p.cred)

	if p.dir, err = os.MkdirTemp("", tempPrefix); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	defer func() {
		if err != nil {
			_ = p.Stop() // kills a half-started server and removes the dir
		}
	}()
	// owner.pid lets a later run reap this cluster if we die without Stop.
	if err := os.WriteFile(filepath.Join(p.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if err := p.chown(p.dir); err != nil {
		return nil, err
	}

	if out, err := p.run(ctx, "initdb", "-D", p.dataDir(), "-U", pgUser, "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return nil, fmt.Errorf("stack: initdb: %w\n%s", err, out)
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
		return nil, fmt.Errorf("stack: pg_ctl start: %w\n%s\n--- %s ---\n%s", err, out, p.LogFile(), tail(log))
	}
	if err := waitReady(ctx, p.URL("postgres")); err != nil {
		return nil, err
	}
	return p, nil
}

// External reports whether the server comes from DATABASE_URL.
func (p *Postgres) External() bool { return p.ext != nil }

// Dir is the temp dir of a throwaway cluster ("" when external).
func (p *Postgres) Dir() string { return p.dir }

// LogFile is the server log of a throwaway cluster ("" when external).
func (p *Postgres) LogFile() string {
	if p.External() {
		return ""
	}
	return filepath.Join(p.dir, "postgres.log")
}

// URL returns the connection URL of database dbname:
// postgres://postgres@127.0.0.1:port/dbname?sslmode=disable for a throwaway
// cluster, DATABASE_URL with its database name replaced when external.
func (p *Postgres) URL(dbname string) string {
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
func (p *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := p.admin(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("stack: lookup database %q: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		// 42P04 duplicate_database, 23505 unique_violation: lost a race
		// with a concurrent CREATE DATABASE of the same name.
		if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")) {
			return "", fmt.Errorf("stack: create database %q: %w", name, err)
		}
	}
	return p.URL(name), nil
}

// DropDatabase drops database name, closing any sessions still on it. Tests
// call it when they end, so runs against a DATABASE_URL leave nothing behind.
func (p *Postgres) DropDatabase(ctx context.Context, name string) error {
	conn, err := p.admin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("stack: drop database %q: %w", name, err)
	}
	return nil
}

// admin connects to the database that creates and drops the others: the
// throwaway server's "postgres", or DATABASE_URL's.
func (p *Postgres) admin(ctx context.Context) (*pgx.Conn, error) {
	url := p.URL("postgres")
	if p.External() {
		url = p.ext.String()
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("stack: connect: %w", err)
	}
	return conn, nil
}

// Restart crashes the throwaway server (`pg_ctl restart -m immediate`, i.e.
// no shutdown checkpoint, crash recovery on start) and waits until it accepts
// connections again. Existing connections are broken. It fails when external.
func (p *Postgres) Restart(ctx context.Context) error {
	if p.External() {
		return errors.New("stack: cannot restart an external Postgres (DATABASE_URL)")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return errors.New("stack: postgres stopped")
	}
	if out, err := p.run(ctx, "pg_ctl", "restart", "-D", p.dataDir(), "-m", "immediate",
		"-l", p.LogFile(), "-w", "-t", "60"); err != nil {
		log, _ := os.ReadFile(p.LogFile())
		return fmt.Errorf("stack: pg_ctl restart: %w\n%s\n--- %s ---\n%s", err, out, p.LogFile(), tail(log))
	}
	return waitReady(ctx, p.URL("postgres"))
}

// DropAtStop has Stop drop database name, for callers that have no
// testing.TB to hang DropWhenDone on (examples). A throwaway cluster goes
// with its databases anyway; on DATABASE_URL this leaves nothing behind.
func (p *Postgres) DropAtStop(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropAtStop = append(p.dropAtStop, name)
}

// Stop shuts the throwaway server down (`pg_ctl stop -m fast`, falling back to
// signalling the postmaster) and removes its temp dir. When external, it only
// drops the databases given to DropAtStop. It is safe to call more than once.
func (p *Postgres) Stop() error {
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
		err = errors.Join(err, fmt.Errorf("stack: remove %s: %w", p.dir, rmErr))
	}
	return err
}

// dropRegistered drops, once, the databases given to DropAtStop.
func (p *Postgres) dropRegistered() error {
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

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }

// writeStackConf writes the settings that differ from initdb's defaults.
func (p *Postgres) writeStackConf() error {
	conf := fmt.Sprintf(`# written by internal/stack
port = %d
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
max_connections = 300
# durability stays on (these are the defaults, spelled out on purpose)
fsync = on
synchronous_commit = on
`, p.port, p.dir)
	// STACK_POSTGRES_CONF adds settings, one per line, for working on speed:
	// e.g. shared_preload_libraries = 'pg_stat_statements'.
	if extra := os.Getenv("STACK_POSTGRES_CONF"); extra != "" {
		conf += "# from STACK_POSTGRES_CONF\n" + extra + "\n"
	}
	path := filepath.Join(p.dataDir(), "stack.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	return p.chown(path)
}

func (p *Postgres) appendConf(s string) error {
	f, err := os.OpenFile(filepath.Join(p.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	return nil
}

func (p *Postgres) chown(path string) error {
	if p.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	return nil
}

func (p *Postgres) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	return runPG(ctx, p.binDir, p.cred, p.dir, bin, args...)
}

// runPG runs a Postgres binary, as cred's user when cred is set, in dir (the
// postgres user may not be able to enter our working directory). PG*
// variables are dropped from the environment so they cannot redirect it.
// pg_ctl is always given -l, so the postmaster does not inherit our output
// pipes (which would make CombinedOutput wait for the server to exit).
func runPG(ctx context.Context, binDir string, cred *syscall.Credential, dir, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "LANG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return cmd.CombinedOutput()
}

// stopCluster stops the cluster in dir (if one is running): pg_ctl stop with
// the given mode, then SIGQUIT / SIGKILL to the postmaster if that failed.
func stopCluster(binDir string, cred *syscall.Credential, dir, mode string) error {
	data := filepath.Join(dir, "data")
	pid := postmasterPID(data)
	if pid <= 0 {
		return nil // never started, or already gone
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := runPG(ctx, binDir, cred, dir, "pg_ctl", "stop", "-D", data, "-m", mode, "-w", "-t", "20")
	if err == nil || !alive(pid) {
		return nil
	}
	// SIGQUIT is an immediate shutdown; the backends exit with the postmaster.
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return fmt.Errorf("stack: pg_ctl stop: %w\n%s", err, out)
}

// reapStale stops and removes throwaway clusters left behind by processes
// that died without calling Stop (go test timeouts, SIGKILL, ...). Only dirs
// whose owner.pid names a dead process are touched.
func reapStale(binDir string, cred *syscall.Credential) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		if owner, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || alive(owner) {
			continue
		}
		_ = stopCluster(binDir, cred, dir, "immediate")
		_ = os.RemoveAll(dir)
	}
}

// postmasterPID reads the first line of data/postmaster.pid (0 if absent).
func postmasterPID(data string) int {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// waitReady polls url until a connection succeeds or ctx (default deadline
// readyTimeout) expires.
func waitReady(ctx context.Context, url string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, readyTimeout)
		defer cancel()
	}
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(attempt, url)
		if err == nil {
			err = conn.Ping(attempt)
			_ = conn.Close(attempt)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: postgres not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func findPGBin() (string, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		return dir, nil
	}
	if path, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real
		}
		return filepath.Dir(path), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { // newest major version first
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("stack: no Postgres binaries found (set DATABASE_URL, PG_BIN or put pg_ctl on PATH)")
}

func lookupCred(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort asks the kernel for a free TCP port on 127.0.0.1, one this
// process has not used before.
func freePort() (int, error) {
	port, err := procs.FreePort()
	if err != nil {
		return 0, fmt.Errorf("stack: %w", err)
	}
	return port, nil
}

// tail returns the last few KB of a log, for error messages.
func tail(b []byte) string {
	const max = 4 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
