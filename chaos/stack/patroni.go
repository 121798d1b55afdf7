package stack

// A replicated Postgres the way our users run it: Patroni (Debian's
// patroni) keeping three Postgres 15 nodes, one primary and two replicas,
// with its leader lock in etcd (Debian's etcd-server). Clients reach the
// primary with a multi-host URL and target_session_attrs=read-write (URL):
// libpq's and pgx's own failover, no proxy to start, to fail, or to lie
// about which node is the primary. A proxy routing on Patroni's REST
// health checks (haproxy) works too, and hides nothing this URL shows: a
// connection to the old primary breaks at the failover either way.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// PatroniOptions configures StartPatroni.
type PatroniOptions struct {
	// Nodes is how many Postgres nodes Patroni keeps. Defaults to 3.
	Nodes int
	// Synchronous turns on Patroni's synchronous_mode with
	// synchronous_mode_strict: a commit returns only once a synchronous
	// replica has it, and only that replica may be promoted. Off, the
	// replicas are asynchronous, Patroni's default, and a failover may lose
	// the last transactions the old primary committed.
	Synchronous bool
	// Log receives one line per step. Defaults to nothing.
	Log func(format string, args ...any)
}

// PatroniCluster is a started cluster: etcd and the Postgres nodes under
// Patroni, in a directory of its own.
type PatroniCluster struct {
	dir    string
	opts   PatroniOptions
	bin    string
	cred   *syscall.Credential
	etcd   *exec.Cmd
	etcdAt string
	nodes  []*PGNode
	log    func(string, ...any)
}

// PGNode is one Postgres node and the Patroni that keeps it.
type PGNode struct {
	Name    string
	c       *PatroniCluster
	dir     string
	pgPort  int
	apiPort int

	mu  sync.Mutex
	cmd *exec.Cmd
}

// The cluster's timing (Patroni's dynamic configuration): a leader that
// stops renewing its lock loses it after ttl seconds; loop_wait + 2 ×
// retry_timeout must not pass ttl.
//
// patroniMaxLag is maximum_lag_on_failover: a replica further behind the
// leader's last known position is not promoted. Patroni's default, 1 MB,
// bounds what an asynchronous failover may lose; it does not stop the loss.
// Here it is larger than the WAL of the 2 s in which the asynchronous
// control's primary sends none (lagFor in chaos/failover.go), which
// passed 1 MB when a checkpoint's full-page images fell inside them: no
// replica was promoted, the run waited for a primary that never came.
const (
	patroniTTL          = 20
	patroniLoopWait     = 1
	patroniRetryTimeout = 5
	patroniMaxLag       = 64 << 20
)

// StartPatroni starts etcd and opts.Nodes Postgres nodes under Patroni,
// and waits until one is the primary and every other streams from it.
func StartPatroni(ctx context.Context, opts PatroniOptions) (_ *PatroniCluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	c := &PatroniCluster{opts: opts, log: opts.Log}
	if c.log == nil {
		c.log = func(string, ...any) {}
	}
	if c.bin, c.cred, err = patroniParts(ctx); err != nil {
		return nil, err
	}
	if c.dir, err = os.MkdirTemp("", "outbox-patroni-"); err != nil {
		return nil, err
	}
	if err := os.Chmod(c.dir, 0o755); err != nil { // the nodes' directories inside are the server user's
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	for i := 1; i <= opts.Nodes; i++ {
		n := &PGNode{Name: fmt.Sprintf("pg%d", i), c: c, dir: filepath.Join(c.dir, fmt.Sprintf("pg%d", i))}
		if n.pgPort, err = freePort(); err != nil {
			return nil, err
		}
		if n.apiPort, err = freePort(); err != nil {
			return nil, err
		}
		if err := n.writeConfig(); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	// The first node bootstraps the cluster; the others then clone it
	// (pg_basebackup), one after the other.
	for _, n := range c.nodes {
		if err := n.Start(); err != nil {
			return nil, err
		}
		if err := c.waitFor(ctx, 2*time.Minute, n.Name+" running", func() bool { return n.state() == "running" }); err != nil {
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	mode := "asynchronous"
	if opts.Synchronous {
		mode = "synchronous (strict)"
	}
	c.log("postgres: Patroni cluster of %d nodes, %s replication, in %s", len(c.nodes), mode, c.dir)
	return c, nil
}

// patroniParts finds what a Patroni cluster needs: Patroni, etcd, and a
// whole set of Postgres server binaries (Patroni runs pg_controldata,
// pg_basebackup and pg_rewind; the registry's embedded-postgres binaries
// are only initdb, pg_ctl and postgres), with the OS user to run them as.
func patroniParts(ctx context.Context) (bin string, cred *syscall.Credential, err error) {
	for _, b := range []string{"patroni", "patronictl", "etcd"} {
		if _, err := exec.LookPath(b); err != nil {
			return "", nil, fmt.Errorf("stack: %s is not installed (Debian: apt-get install patroni etcd-server python3-etcd): %w", b, err)
		}
	}
	if bin, cred, err = pgtest.ServerBinaries(ctx); err != nil {
		return "", nil, err
	}
	for _, b := range []string{"pg_controldata", "pg_basebackup", "pg_rewind"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return "", nil, fmt.Errorf("stack: Patroni needs Postgres's %s, which %s lacks (Debian: apt-get install postgresql-15)", b, bin)
		}
	}
	return bin, cred, nil
}

// RequirePatroni skips t where a Patroni cluster cannot be started here
// (patroniParts says why), and fails it instead with REQUIRE_PATRONI set
// (make failover, in CI), so the failover tests cannot pass there by
// being skipped.
func RequirePatroni(t testing.TB) {
	t.Helper()
	if _, _, err := patroniParts(context.Background()); err != nil {
		if os.Getenv("REQUIRE_PATRONI") != "" {
			t.Fatalf("REQUIRE_PATRONI is set: %v", err)
		}
		t.Skipf("skipping the replicated-Postgres test: %v", err)
	}
}

func (c *PatroniCluster) startEtcd(ctx context.Context) error {
	client, err := freePort()
	if err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	c.etcdAt = fmt.Sprintf("127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	logf, err := os.Create(filepath.Join(c.dir, "etcd.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	c.etcd = exec.Command("etcd", "--name", "etcd", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", "http://"+c.etcdAt, "--advertise-client-urls", "http://"+c.etcdAt,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "etcd="+peerURL, "--log-level", "warn",
		// Patroni speaks etcd's v2 API to it (patroni.yml's etcd:, below).
		"--enable-v2=true")
	c.etcd.Stdout, c.etcd.Stderr = logf, logf
	c.etcd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.etcd.Start(); err != nil {
		return fmt.Errorf("stack: starting etcd: %w", err)
	}
	return c.waitFor(ctx, 30*time.Second, "etcd", func() bool {
		resp, err := http.Get("http://" + c.etcdAt + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// writeConfig writes the node's patroni.yml. Every port is on 127.0.0.1;
// authentication is trust from 127.0.0.1 alone, so no password is
// written anywhere.
//
// Patroni reaches etcd through its v2 API (etcd:, not etcd3:). Debian's
// Patroni 3.0.2 renews the leader key through etcd3 with an unconditional
// put once its lease has expired (patroni/patroni#2689, fixed in 3.0.3): a
// cut-off primary, thawed, took the lock back two seconds after a replica
// was promoted on it, and the promoted node was demoted and rewound. The v2
// code renews with a compare-and-swap on the key's value.
func (n *PGNode) writeConfig() error {
	c := n.c
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		return err
	}
	sync := strconv.FormatBool(c.opts.Synchronous)
	cfg := fmt.Sprintf(`scope: outbox
name: %[1]s
log:
  level: INFO
  dir: %[2]s
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd:
  hosts: %[4]s
bootstrap:
  dcs:
    ttl: %[8]d
    loop_wait: %[9]d
    retry_timeout: %[10]d
    maximum_lag_on_failover: %[11]d
    synchronous_mode: %[7]s
    synchronous_mode_strict: %[7]s
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 300
        wal_keep_size: 256MB
  initdb:
  - encoding: UTF8
  - no-locale
  - auth: trust
  - username: postgres
  pg_hba:
  - local all all trust
  - host replication all 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[5]d
  connect_address: 127.0.0.1:%[5]d
  data_dir: %[2]s/data
  bin_dir: %[6]s
  pgpass: %[2]s/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
  parameters:
    unix_socket_directories: %[2]s
`, n.Name, n.dir, n.apiPort, c.etcdAt, n.pgPort, c.bin, sync, patroniTTL, patroniLoopWait, patroniRetryTimeout, patroniMaxLag)
	if err := os.WriteFile(n.config(), []byte(cfg), 0o600); err != nil {
		return err
	}
	return n.chown()
}

func (n *PGNode) config() string { return filepath.Join(n.dir, "patroni.yml") }

// chown gives the node's directory to the user Postgres runs as.
func (n *PGNode) chown() error {
	if n.c.cred == nil {
		return nil
	}
	return filepath.Walk(n.dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(n.c.cred.Uid), int(n.c.cred.Gid))
	})
}

// Start starts the node's Patroni, which starts its Postgres: as the
// primary it was, or as a replica of the leader (rewound with pg_rewind
// where it had gone ahead of it).
func (n *PGNode) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(n.dir, "patroni.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("patroni", n.config())
	cmd.Dir = n.dir
	cmd.Env = append(os.Environ(), "HOME="+n.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.c.cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("stack: starting patroni %s: %w", n.Name, err)
	}
	n.cmd = cmd
	go cmd.Wait() //nolint:errcheck // reaped; Kill and Close look at the process itself
	return nil
}

// Kill kills the node with SIGKILL, Patroni and Postgres alike, as a
// machine that loses its power: no demotion, no shutdown checkpoint.
// Its Postgres would otherwise stay up as a primary nobody fences.
func (n *PGNode) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if pid := n.postmasterPID(); pid > 0 {
		// Every child too, as a power loss takes them: a child does exit
		// when it sees its postmaster gone, but a stopped one
		// (StopSending) never looks, nor does one asleep on a lock a
		// killed child held, and either would hold the shared memory the
		// next postmaster needs. The postmaster is stopped first, so that
		// no child is forked between the listing and the kill (one forked
		// there was adopted by init and slept on for good, and the node
		// never started again).
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		children := childrenOf(pid) // before it dies: then init adopts them
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for _, child := range children {
			_ = syscall.Kill(child, syscall.SIGKILL)
		}
	}
	if n.cmd != nil {
		_ = n.cmd.Process.Kill()
		n.cmd = nil
	}
}

// Freeze stops every process of the node with SIGSTOP: Patroni, the
// postmaster and each of its children. To the rest of the cluster it is a
// node cut off by the network: it renews no lock and answers nothing, and
// its Postgres, thawed, still holds the connections it had. (A stand-in
// for a partition: this test bed has no network of its own between the
// nodes; connections time out only where a client set a timeout.)
func (n *PGNode) Freeze() error { return n.signalAll(syscall.SIGSTOP) }

// Thaw resumes a frozen node: its Patroni finds another leader, if one
// was elected meanwhile, and demotes its Postgres to a replica of it.
func (n *PGNode) Thaw() error { return n.signalAll(syscall.SIGCONT) }

func (n *PGNode) signalAll(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("stack: %s is not running", n.Name)
	}
	pids := []int{}
	if pm := n.postmasterPID(); pm > 0 {
		pids = append(pids, pm) // first, so that it forks no child after the others stop
		pids = append(pids, childrenOf(pm)...)
	}
	pids = append(pids, n.cmd.Process.Pid)
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stack: signalling %s's pid %d: %w", n.Name, pid, err)
		}
	}
	return nil
}

// StopSending stops the node's WAL senders (SIGSTOP) and returns how
// many it stopped: its replicas fall behind, as over a slow link, and
// under asynchronous replication it commits on without them. (Stopping a
// replica's receiver instead loses nothing: the sender goes on filling
// the socket's buffers, which the receiver reads when it resumes.) They
// resume with the node (Thaw), or die with it (Kill).
func (n *PGNode) StopSending() (int, error) {
	pm := n.postmasterPID()
	if pm == 0 {
		return 0, nil
	}
	stopped := 0
	for _, pid := range childrenOf(pm) {
		title, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !strings.Contains(string(title), "walsender") {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
			return stopped, fmt.Errorf("stack: stopping %s's walsender: %w", n.Name, err)
		}
		stopped++
	}
	return stopped, nil
}

// childrenOf lists the processes whose parent is pid (/proc).
func childrenOf(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
				child, _ := strconv.Atoi(filepath.Base(filepath.Dir(st)))
				out = append(out, child)
			}
		}
	}
	return out
}

// Running reports whether the node's Patroni runs.
func (n *PGNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

func (n *PGNode) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(n.dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if pid <= 0 || !alive(pid) {
		return 0
	}
	return pid
}

// Addr is the node's Postgres address.
func (n *PGNode) Addr() string { return fmt.Sprintf("127.0.0.1:%d", n.pgPort) }

// URL is a URL of the node's database db, whatever its role.
func (n *PGNode) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", n.Addr(), db)
}

// PatroniStatus is what a node's Patroni says of itself (GET /patroni).
type PatroniStatus struct {
	State    string `json:"state"` // running, starting, stopped, ...
	Role     string `json:"role"`  // master (3.0's word for the primary), replica
	Timeline int    `json:"timeline"`
	Xlog     struct {
		Location         int64 `json:"location"`          // the primary's WAL position
		ReceivedLocation int64 `json:"received_location"` // a replica's
		ReplayedLocation int64 `json:"replayed_location"`
	} `json:"xlog"`
	Replication []struct {
		Name      string `json:"application_name"`
		State     string `json:"state"`
		SyncState string `json:"sync_state"`
	} `json:"replication"`
}

// Status asks the node's Patroni; an error when it does not answer.
func (n *PGNode) Status() (PatroniStatus, error) {
	var st PatroniStatus
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/patroni", n.apiPort))
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(body, &st)
}

func (n *PGNode) state() string {
	st, err := n.Status()
	if err != nil {
		return ""
	}
	return st.State
}

// Primary reports whether the node is the primary, holding the leader
// lock (Patroni's GET /leader answers 200).
func (n *PGNode) Primary() bool {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/leader", n.apiPort))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Nodes returns the cluster's nodes.
func (c *PatroniCluster) Nodes() []*PGNode { return append([]*PGNode(nil), c.nodes...) }

// Dir is the cluster's directory: each node's patroni.yml, logs and data.
func (c *PatroniCluster) Dir() string { return c.dir }

// Synchronous reports whether the cluster replicates synchronously.
func (c *PatroniCluster) Synchronous() bool { return c.opts.Synchronous }

// Primary returns the node that is the primary now, or nil when none is.
func (c *PatroniCluster) Primary() *PGNode {
	for _, n := range c.nodes {
		if n.Running() && n.Primary() {
			return n
		}
	}
	return nil
}

// WaitPrimary waits until a node is the primary and takes writes.
func (c *PatroniCluster) WaitPrimary(ctx context.Context, timeout time.Duration) (*PGNode, error) {
	var p *PGNode
	err := c.waitFor(ctx, timeout, "a primary", func() bool {
		if p = c.Primary(); p == nil {
			return false
		}
		conn, err := pgx.Connect(ctx, p.URL("postgres"))
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var ro string
		return conn.QueryRow(ctx, `SHOW transaction_read_only`).Scan(&ro) == nil && ro == "off"
	})
	return p, err
}

// WaitHealthy waits until there is a primary and every running node
// streams from it; in synchronous mode, until Patroni has named a
// synchronous standby too (its /sync key): only that node may be promoted,
// so a primary killed before it names one leaves no node Patroni will
// promote until it comes back.
func (c *PatroniCluster) WaitHealthy(ctx context.Context) error {
	if _, err := c.WaitPrimary(ctx, 2*time.Minute); err != nil {
		return err
	}
	return c.waitFor(ctx, 2*time.Minute, "every replica streaming", func() bool {
		// The primary as it is now: a node promoted a moment ago can lose
		// the lock again (a thawed old primary that renewed it first, seen
		// in a failover run), and a wait pinned to it never ends.
		p := c.Primary()
		if p == nil {
			return false
		}
		members, err := p.members()
		if err != nil {
			return false
		}
		streaming, sync := 0, 0
		for _, m := range members {
			if m.Name != p.Name && (m.State == "streaming" || m.State == "running") && m.Role != "leader" {
				streaming++
			}
			if m.Role == "sync_standby" {
				sync++
			}
		}
		want := c.runningReplicas(p)
		return streaming >= want && (!c.opts.Synchronous || want == 0 || sync >= 1)
	})
}

// runningReplicas counts the running nodes other than the primary p.
func (c *PatroniCluster) runningReplicas(p *PGNode) int {
	want := 0
	for _, n := range c.nodes {
		if n != p && n.Running() {
			want++
		}
	}
	return want
}

// WaitStreaming waits until the primary sends WAL to every running replica
// as it sees them itself (pg_stat_replication): a replica Patroni calls
// running may not have connected yet.
func (c *PatroniCluster) WaitStreaming(ctx context.Context) error {
	p, err := c.WaitPrimary(ctx, 2*time.Minute)
	if err != nil {
		return err
	}
	return c.waitFor(ctx, 2*time.Minute, "the primary streaming to every replica", func() bool {
		st, err := p.Status()
		if err != nil {
			return false
		}
		streaming := 0
		for _, r := range st.Replication {
			if r.State == "streaming" {
				streaming++
			}
		}
		return streaming >= c.runningReplicas(p)
	})
}

// Member is a node as Patroni's cluster view (GET /cluster) has it.
type Member struct {
	Name  string `json:"name"`
	Role  string `json:"role"`  // leader, sync_standby, replica
	State string `json:"state"` // running, streaming, stopped, ...
}

// members asks the node's Patroni for the cluster's members.
func (n *PGNode) members() ([]Member, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/cluster", n.apiPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Members []Member `json:"members"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	return body.Members, nil
}

// Switchover hands the primary's role to a replica on purpose, with
// patronictl, as an operator does before maintenance, and returns the new
// primary.
func (c *PatroniCluster) Switchover(ctx context.Context) (*PGNode, error) {
	old := c.Primary()
	if old == nil {
		return nil, errors.New("stack: no primary to switch over from")
	}
	cmd := exec.CommandContext(ctx, "patronictl", "-c", old.config(), "switchover", "--leader", old.Name, "--force")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Env = append(os.Environ(), "HOME="+old.dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("stack: patronictl switchover: %w\n%s", err, out)
	}
	var p *PGNode
	err := c.waitFor(ctx, time.Minute, "the switchover", func() bool {
		p = c.Primary()
		return p != nil && p != old
	})
	return p, err
}

// URL is a URL of database db that reaches the primary wherever it is:
// every node's address, and target_session_attrs=read-write, so that a
// connection made after a failover finds the new primary.
func (c *PatroniCluster) URL(db string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = n.Addr()
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		strings.Join(hosts, ","), db)
}

// CreateDatabase creates database name on the primary (the replicas get
// it through replication) and returns its URL.
func (c *PatroniCluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("stack: connecting to the primary: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("stack: creating database %s: %w", name, err)
	}
	return c.URL(name), nil
}

// DropDatabase drops database name on the primary, closing any sessions
// still on it.
func (c *PatroniCluster) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("stack: connecting to the primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("stack: dropping database %s: %w", name, err)
	}
	return nil
}

// External is false: the harness started the cluster (system.Postgres).
func (c *PatroniCluster) External() bool { return false }

// Restart kills every node at once, as a power cut of the whole cluster,
// starts them again, and waits until it is healthy.
func (c *PatroniCluster) Restart(ctx context.Context) error {
	for _, n := range c.nodes {
		n.Kill()
	}
	for _, n := range c.nodes {
		if err := n.Start(); err != nil {
			return err
		}
	}
	return c.WaitHealthy(ctx)
}

// Stop is Close, for system.Postgres.
func (c *PatroniCluster) Stop() error {
	c.Close()
	return nil
}

// Close kills every node and etcd, and removes the directory.
func (c *PatroniCluster) Close() {
	for _, n := range c.nodes {
		n.Kill()
	}
	if c.etcd != nil && c.etcd.Process != nil {
		_ = c.etcd.Process.Kill()
		_ = c.etcd.Wait()
	}
	if c.dir != "" && os.Getenv("KEEP_PATRONI") == "" {
		_ = os.RemoveAll(c.dir)
	}
}

// Logs returns the tail of each node's Patroni log, for a failure's report.
func (c *PatroniCluster) Logs() string {
	var b bytes.Buffer
	for _, n := range c.nodes {
		for _, f := range []string{"patroni.out", "patroni.log"} { // Postgres's output; Patroni's own
			out, _ := os.ReadFile(filepath.Join(n.dir, f))
			fmt.Fprintf(&b, "--- %s %s ---\n%s\n", n.Name, f, tail(out))
		}
	}
	return b.String()
}

// waitFor polls cond every 100ms until it holds, failing after timeout
// with what it waited for and the nodes' logs.
func (c *PatroniCluster) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("stack: waited %v for %s\n%s", timeout, what, c.Logs())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}
