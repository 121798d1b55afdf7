package pgtest

// The throwaway cluster's machinery: its config, initdb/pg_ctl runs as the
// postgres user, and the reaping of clusters whose owner died.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

func (p *Server) dataDir() string { return filepath.Join(p.dir, "data") }

// writeStackConf writes the settings that differ from initdb's defaults.
func (p *Server) writeStackConf() error {
	conf := fmt.Sprintf(`# written by pgtest
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
		return fmt.Errorf("pgtest: %w", err)
	}
	return p.chown(path)
}

func (p *Server) appendConf(s string) error {
	f, err := os.OpenFile(filepath.Join(p.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

func (p *Server) chown(path string) error {
	if p.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

func (p *Server) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
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
	return fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, out)
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
			return fmt.Errorf("pgtest: postgres not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// findPGBin finds the server binaries: $PG_BIN, next to pg_ctl on $PATH,
// the newest /usr/lib/postgresql/*/bin, and where none is installed,
// RegistryVersion fetched from Maven Central (registry.go).
func findPGBin(ctx context.Context) (string, error) {
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
	return registryBin(ctx)
}

// serverUser is the OS user a root process runs the server as (initdb
// refuses root): postgres where a Postgres package made one, else nobody.
func serverUser() (*syscall.Credential, error) {
	cred, err := lookupCred(pgUser)
	if err == nil {
		return cred, nil
	}
	if nobody, nerr := lookupCred("nobody"); nerr == nil {
		return nobody, nil
	}
	return nil, fmt.Errorf("pgtest: running as root needs a %q or \"nobody\" OS user: %w", pgUser, err)
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

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last few KB of a log, for error messages.
func tail(b []byte) string {
	const max = 4 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// ServerBinaries returns the directory of the Postgres server binaries
// Start would use (findPGBin), and the OS user a root process must run
// them as (nil when this process is not root): for a harness that runs
// the server its own way (a replicated cluster under Patroni).
func ServerBinaries(ctx context.Context) (binDir string, cred *syscall.Credential, err error) {
	if binDir, err = findPGBin(ctx); err != nil {
		return "", nil, err
	}
	if os.Geteuid() == 0 {
		if cred, err = serverUser(); err != nil {
			return "", nil, err
		}
	}
	return binDir, cred, nil
}
