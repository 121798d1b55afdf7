package stack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"

	kafkadist "github.com/outboxref/outbox-inbox/deploy/kafka"
)

// ApacheVersion is the Apache Kafka version the real-Kafka stack runs: the
// one deploy/kafka/pom.xml pins and docker-compose.yml's image carries.
var ApacheVersion = kafkadist.Version

// apacheClusterID is the KRaft cluster id every throwaway cluster is
// formatted with (docker-compose.yml's CLUSTER_ID).
const apacheClusterID = "E0xoLuzoSA-82Cw8DvXKoQ"

// apacheTempPrefix names the temp dirs of throwaway clusters; StartApache
// reaps dirs with this prefix whose owning process has died.
const apacheTempPrefix = "stack-kafka-"

// ApacheOptions configures StartApache.
type ApacheOptions struct {
	// Nodes is the number of KRaft nodes, each broker and controller in one
	// JVM process. Defaults to 1.
	Nodes int
	// Partitions of auto-created topics (num.partitions). Defaults to 6.
	Partitions int
	// MinSessionTimeout, if > 0, sets group.min.session.timeout.ms, so
	// consumers may use shorter group sessions than Kafka's 6s floor.
	MinSessionTimeout time.Duration
	// Settings are added to every node's server.properties, after (and so
	// over) the stack's own.
	Settings map[string]string
	// AdvertiseClient, when set, maps a node's CLIENT listener address to
	// the address it advertises, e.g. a TCP proxy in front of it. Clients
	// that bootstrap from Brokers are then sent there; those that bootstrap
	// from InternalBrokers keep talking to the nodes directly.
	AdvertiseClient func(node int, addr string) string
	// HeapMB is each JVM's maximum heap. Defaults to 512: a broker's whole
	// working set here is a few hundred megabytes, and three nodes beside
	// Postgres and the services fit a 24 GiB machine with room to spare.
	HeapMB int
	// Log, when set, receives one line per step (jar resolution, starts).
	Log func(format string, args ...any)
}

// ApacheCluster is Apache Kafka running on this machine from its Maven
// Central jars: KRaft combined mode, every node a separate JVM process on
// loopback ports that the caller can kill, pause and restart on its data.
type ApacheCluster struct {
	dir   string
	nodes []*KafkaNode
	log   func(string, ...any)
	once  sync.Once
}

// KafkaNode is one broker-and-controller JVM of an ApacheCluster.
type KafkaNode struct {
	ID       int
	dir      string // data/, server.properties, broker.log
	argv     []string
	client   string // CLIENT listener (services), possibly advertised elsewhere
	internal string // INTERNAL listener (inter-broker, the harness's own clients)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
	starts int
}

// StartApache resolves the broker's jars (see ApacheJars), formats each
// node's storage with the broker's own storage tool, starts every node and
// waits until the cluster answers a client: every node listed in its
// metadata and a group coordinator found (which creates __consumer_offsets).
// It needs java (JAVA_HOME or PATH) and, for a cold jar cache, mvn.
//
// Replication follows the cluster's size: with three or more nodes topics get
// replication factor 3 and min.insync.replicas=2, so a producer with
// acks=all survives one dead broker; with fewer, everything is replicated
// on all nodes. Broker sessions are short (3s), so a killed or paused
// broker is fenced, and its partitions lead elsewhere, within seconds.
//
// On error everything started so far is stopped and removed.
func StartApache(ctx context.Context, opts ApacheOptions) (_ *ApacheCluster, err error) {
	if opts.Nodes <= 0 {
		opts.Nodes = 1
	}
	if opts.Partitions <= 0 {
		opts.Partitions = DefaultPartitions
	}
	if opts.HeapMB <= 0 {
		opts.HeapMB = 512
	}
	c := &ApacheCluster{log: opts.Log}
	if c.log == nil {
		c.log = func(string, ...any) {}
	}
	admin := AdminCredentials() // the harness's clients log in as the superuser
	kafkaconf.UseCredentials(admin)
	java, err := findJava()
	if err != nil {
		return nil, err
	}
	libs, err := ApacheJars(ctx, c.log)
	if err != nil {
		return nil, err
	}
	reapStaleKafka()
	if c.dir, err = os.MkdirTemp("", apacheTempPrefix); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := os.WriteFile(filepath.Join(c.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "log4j2.properties"), []byte(log4j2Config), 0o644); err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}

	type ports struct{ client, internal, controller int }
	all := make([]ports, opts.Nodes)
	var voters []string
	for i := range all {
		for _, p := range []*int{&all[i].client, &all[i].internal, &all[i].controller} {
			if *p, err = freePort(); err != nil {
				return nil, err
			}
		}
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, all[i].controller))
	}
	rf := min(3, opts.Nodes)
	isr := min(2, opts.Nodes)
	for i, p := range all {
		id := i + 1
		n := &KafkaNode{
			ID:       id,
			dir:      filepath.Join(c.dir, fmt.Sprintf("node-%d", id)),
			client:   fmt.Sprintf("127.0.0.1:%d", p.client),
			internal: fmt.Sprintf("127.0.0.1:%d", p.internal),
		}
		advertised := n.client
		if opts.AdvertiseClient != nil {
			advertised = opts.AdvertiseClient(id, n.client)
		}
		props := map[string]string{
			"process.roles":                                    "broker,controller",
			"node.id":                                          strconv.Itoa(id),
			"controller.quorum.voters":                         strings.Join(voters, ","),
			"listeners":                                        fmt.Sprintf("CLIENT://%s,INTERNAL://%s,CONTROLLER://127.0.0.1:%d", n.client, n.internal, p.controller),
			"advertised.listeners":                             fmt.Sprintf("CLIENT://%s,INTERNAL://%s", advertised, n.internal),
			"controller.listener.names":                        "CONTROLLER",
			"inter.broker.listener.name":                       "INTERNAL",
			"listener.security.protocol.map":                   "CLIENT:SASL_PLAINTEXT,INTERNAL:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
			"log.dirs":                                         filepath.Join(n.dir, "data"),
			"num.partitions":                                   strconv.Itoa(opts.Partitions),
			"default.replication.factor":                       strconv.Itoa(rf),
			"min.insync.replicas":                              strconv.Itoa(isr),
			"offsets.topic.replication.factor":                 strconv.Itoa(rf),
			"offsets.topic.num.partitions":                     "10",
			"transaction.state.log.replication.factor":         strconv.Itoa(rf),
			"transaction.state.log.min.isr":                    strconv.Itoa(isr),
			"share.coordinator.state.topic.replication.factor": strconv.Itoa(rf),
			"share.coordinator.state.topic.min.isr":            strconv.Itoa(isr),
			"group.initial.rebalance.delay.ms":                 "0",
			"unclean.leader.election.enable":                   "false",
			// A dead or paused broker is fenced by the controller after
			// broker.session.timeout.ms, and drops out of the ISR after
			// replica.lag.time.max.ms: seconds, not Kafka's 9 s and 30 s.
			"broker.heartbeat.interval.ms": "500",
			"broker.session.timeout.ms":    "3000",
			"replica.lag.time.max.ms":      "5000",
			// Fewer threads than a production broker: two cores are shared
			// by every node, Postgres and the services.
			"num.network.threads": "2",
			"num.io.threads":      "2",
			"background.threads":  "2",
		}
		for k, v := range apacheAuth(admin) {
			props[k] = v
		}
		if opts.MinSessionTimeout > 0 {
			props["group.min.session.timeout.ms"] = strconv.FormatInt(opts.MinSessionTimeout.Milliseconds(), 10)
		}
		for k, v := range opts.Settings {
			props[k] = v
		}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return nil, fmt.Errorf("stack: %w", err)
		}
		conf := filepath.Join(n.dir, "server.properties")
		if err := os.WriteFile(conf, []byte(properties(props)), 0o600); err != nil { // it holds admin's password
			return nil, fmt.Errorf("stack: %w", err)
		}
		jvm := []string{
			java,
			fmt.Sprintf("-Xmx%dm", opts.HeapMB), "-Xms128m",
			"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
			"-Djava.awt.headless=true",
			"-Dlog4j2.configurationFile=" + filepath.Join(c.dir, "log4j2.properties"),
			"-cp", filepath.Join(libs, "*"),
		}
		format := append(append([]string(nil), jvm...), "kafka.tools.StorageTool", "format",
			"--cluster-id", apacheClusterID, "--config", conf, "--ignore-formatted",
			"--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", kafkaconf.ScramSHA512, admin.Username, admin.Password))
		cmd := exec.CommandContext(ctx, format[0], format[1:]...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("stack: kafka storage format (node %d): %w\n%s", id, err, tail(out))
		}
		n.argv = append(append([]string(nil), jvm...), "kafka.Kafka", conf)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := n.Start(); err != nil {
			return nil, err
		}
	}
	c.log("kafka: Apache Kafka %s, %d node(s) starting (JVMs, logs in %s)", ApacheVersion, len(c.nodes), c.dir)
	if err := c.WaitReady(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Nodes returns the cluster's nodes, by id (1, 2, …).
func (c *ApacheCluster) Nodes() []*KafkaNode { return append([]*KafkaNode(nil), c.nodes...) }

// Node returns the node with the given id, or nil.
func (c *ApacheCluster) Node(id int) *KafkaNode {
	if id < 1 || id > len(c.nodes) {
		return nil
	}
	return c.nodes[id-1]
}

// Dir is the cluster's temp dir: node-N/{data,server.properties,broker.log}.
func (c *ApacheCluster) Dir() string { return c.dir }

// Brokers returns the bootstrap addresses of the CLIENT listeners: what the
// services are given.
func (c *ApacheCluster) Brokers() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.client)
	}
	return out
}

// InternalBrokers returns the bootstrap addresses of the INTERNAL listeners,
// which no proxy stands in front of: for the harness's own clients.
func (c *ApacheCluster) InternalBrokers() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.internal)
	}
	return out
}

// WaitReady waits until every running (not paused) node is listed in the
// cluster's metadata and a group coordinator answers.
func (c *ApacheCluster) WaitReady(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, 2*time.Minute)
	defer cancel()
	var up []*KafkaNode // a node running now that exits before the cluster is ready fails the wait
	for _, n := range c.nodes {
		if n.Running() {
			up = append(up, n)
		}
	}
	var last error
	for {
		if last = c.ready(); last == nil {
			return nil
		}
		for _, n := range up {
			if !n.Running() {
				return fmt.Errorf("stack: kafka node %d exited while the cluster was starting (see %s):\n%s", n.ID, n.LogFile(), n.logTail())
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: kafka cluster not ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *ApacheCluster) ready() error {
	client, want, err := c.client(0) // WaitReady polls
	if err != nil {
		return err
	}
	defer client.Close()
	var got []int32
	for _, b := range client.Brokers() {
		got = append(got, b.ID())
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("metadata lists brokers %v, want %v", got, want)
	}
	if err := client.RefreshCoordinator("stack-ready"); err != nil {
		return fmt.Errorf("no group coordinator yet: %w", err)
	}
	return nil
}

// Leader returns the id of the node leading topic/partition, read from the
// cluster's metadata.
func (c *ApacheCluster) Leader(topic string, partition int32) (int, error) {
	client, _, err := c.client(SaramaConfig().Metadata.Retry.Max)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	if err := client.RefreshMetadata(topic); err != nil {
		return 0, err
	}
	b, err := client.Leader(topic, partition)
	if err != nil {
		return 0, err
	}
	return int(b.ID()), nil
}

// Leaders returns the node leading each partition of topic, read from the
// cluster's metadata; a partition with no leader (its leader fenced, no
// other elected yet) is left out.
func (c *ApacheCluster) Leaders(topic string) (map[int32]int, error) {
	client, _, err := c.client(SaramaConfig().Metadata.Retry.Max)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	if err := client.RefreshMetadata(topic); err != nil {
		return nil, err
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	leaders := map[int32]int{}
	for _, p := range parts {
		if b, err := client.Leader(topic, p); err == nil {
			leaders[p] = int(b.ID())
		}
	}
	return leaders, nil
}

// ElectPreferredLeaders asks the controller to give each partition of topic
// back to its preferred replica (the first of its replicas), as Kafka's
// kafka-leader-election.sh --election-type preferred does: after a node came
// back, the partitions it led before it died move back to it, a leader
// change on a live cluster. It returns how many partitions were elected and
// how many could not be yet (their preferred replica not in sync again).
func (c *ApacheCluster) ElectPreferredLeaders(topic string) (elected, notYet int, err error) {
	client, _, err := c.client(SaramaConfig().Metadata.Retry.Max)
	if err != nil {
		return 0, 0, err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return 0, 0, err
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, 0, err
	}
	res, err := admin.ElectLeaders(sarama.PreferredElection, map[string][]int32{topic: parts})
	if err != nil {
		return 0, 0, err
	}
	for p, r := range res[topic] {
		switch {
		case r == nil || errors.Is(r.ErrorCode, sarama.ErrNoError):
			elected++
		case errors.Is(r.ErrorCode, sarama.ErrElectionNotNeeded):
		case errors.Is(r.ErrorCode, sarama.ErrPreferredLeaderNotAvailable):
			notYet++
		default:
			return elected, notYet, fmt.Errorf("electing the preferred leader of %s/%d: %w", topic, p, r.ErrorCode)
		}
	}
	return elected, notYet, nil
}

// Coordinator returns the id of the node coordinating the consumer group.
func (c *ApacheCluster) Coordinator(group string) (int, error) {
	client, _, err := c.client(SaramaConfig().Metadata.Retry.Max)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	if err := client.RefreshCoordinator(group); err != nil {
		return 0, err
	}
	b, err := client.Coordinator(group)
	if err != nil {
		return 0, err
	}
	return int(b.ID()), nil
}

// client connects to the INTERNAL listeners of the nodes that run and are
// not paused, and returns their ids, in order. metadataRetries is Sarama's
// Metadata.Retry.Max: 0 for a caller that polls on its own.
func (c *ApacheCluster) client(metadataRetries int) (sarama.Client, []int32, error) {
	var ids []int32
	var addrs []string
	for _, n := range c.nodes {
		if n.Running() && !n.Paused() {
			ids = append(ids, int32(n.ID))
			addrs = append(addrs, n.internal)
		}
	}
	if len(addrs) == 0 {
		return nil, nil, errors.New("no node running")
	}
	cfg := SaramaConfig()
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = metadataRetries
	client, err := sarama.NewClient(addrs, cfg)
	return client, ids, err
}

// Close kills every node and removes the cluster's dir. Safe to call more
// than once.
func (c *ApacheCluster) Close() {
	if c == nil {
		return
	}
	c.once.Do(func() {
		for _, n := range c.nodes {
			n.Kill()
		}
		if c.dir != "" {
			os.RemoveAll(c.dir)
		}
	})
}

// Start launches the node's JVM on its data dir (again, after Kill). It
// returns once the process runs; ApacheCluster.WaitReady tells when the
// node serves. The JVM dies with this process (Pdeathsig).
func (n *KafkaNode) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.exited:
		default:
			return fmt.Errorf("stack: kafka node %d is running", n.ID)
		}
	}
	logf, err := os.OpenFile(n.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	fmt.Fprintf(logf, "\n==== stack: starting node %d (start %d) ====\n", n.ID, n.starts+1)
	cmd := exec.Command(n.argv[0], n.argv[1:]...)
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("stack: starting kafka node %d: %w", n.ID, err)
	}
	os.WriteFile(filepath.Join(n.dir, "node.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644) //nolint:errcheck // only for reaping
	n.cmd, n.exited, n.paused = cmd, make(chan struct{}), false
	n.starts++
	go func(cmd *exec.Cmd, exited chan struct{}) {
		cmd.Wait() //nolint:errcheck // a killed node is the point
		logf.Close()
		close(exited)
	}(cmd, n.exited)
	return nil
}

// Running reports whether the node's JVM is alive (paused or not).
func (n *KafkaNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Starts counts how often the node was started.
func (n *KafkaNode) Starts() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.starts
}

// Paused reports whether the node was stopped with Pause and not resumed.
func (n *KafkaNode) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused
}

// Pid is the current JVM's pid, 0 when it never started.
func (n *KafkaNode) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Kill SIGKILLs the JVM and waits until it is gone (no-op when not running).
func (n *KafkaNode) Kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.paused = false
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // may be gone already
	<-exited
}

// Pause freezes the JVM with SIGSTOP: its sockets stay open and nothing
// answers, a zombie broker. Resume wakes it with SIGCONT.
func (n *KafkaNode) Pause() error { return n.signalPause(syscall.SIGSTOP, true) }

// Resume sends SIGCONT to a paused JVM.
func (n *KafkaNode) Resume() error { return n.signalPause(syscall.SIGCONT, false) }

func (n *KafkaNode) signalPause(sig syscall.Signal, paused bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("stack: kafka node %d not started", n.ID)
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("stack: kafka node %d: %w", n.ID, err)
	}
	n.paused = paused
	return nil
}

// Addr is the node's CLIENT listener; InternalAddr its INTERNAL one.
func (n *KafkaNode) Addr() string         { return n.client }
func (n *KafkaNode) InternalAddr() string { return n.internal }

// LogFile is the node's broker log, appended to across restarts.
func (n *KafkaNode) LogFile() string { return filepath.Join(n.dir, "broker.log") }

func (n *KafkaNode) logTail() string {
	b, _ := os.ReadFile(n.LogFile())
	return tail(b)
}

// ApacheJars returns the directory holding the broker's jars, resolving
// deploy/kafka/pom.xml with Maven into a cache outside the repository when
// needed: $STACK_KAFKA_CACHE, by default <user cache dir>/outbox-inbox/
// kafka-<version>-<the pom's hash>. A complete cache (its manifest lists every jar with its
// size) is reused; a missing one is filled and a broken one replaced. A file
// lock keeps concurrent test binaries from resolving it twice.
func ApacheJars(ctx context.Context, log func(string, ...any)) (string, error) {
	cache := os.Getenv("STACK_KAFKA_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		// Named by the pom's hash too: two checkouts whose pom.xml differ
		// (a comment, a pinned dependency) each keep their own cache,
		// instead of each deleting the other's under its running brokers.
		sum := sha256.Sum256(kafkadist.POM)
		cache = filepath.Join(base, "outbox-inbox", "kafka-"+ApacheVersion+"-"+hex.EncodeToString(sum[:6]))
	}
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		return "", fmt.Errorf("stack: kafka jar cache: %w", err)
	}
	lock, err := os.OpenFile(cache+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("stack: kafka jar cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("stack: kafka jar cache lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck

	libs := filepath.Join(cache, "libs")
	if err := checkManifest(cache); err == nil {
		return libs, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		log("kafka: jar cache %s is broken (%v); resolving it again", cache, err)
	}
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return "", errors.New("stack: Apache Kafka's jars are not cached and mvn is not on PATH (install Maven, or use the embedded broker: unset STACK_KAFKA)")
	}
	if err := os.RemoveAll(cache); err != nil {
		return "", fmt.Errorf("stack: kafka jar cache: %w", err)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("stack: kafka jar cache: %w", err)
	}
	pom := filepath.Join(cache, "pom.xml")
	if err := os.WriteFile(pom, kafkadist.POM, 0o644); err != nil {
		return "", fmt.Errorf("stack: kafka jar cache: %w", err)
	}
	log("kafka: resolving Apache Kafka %s's jars with Maven into %s", ApacheVersion, cache)
	start := time.Now()
	cmd := exec.CommandContext(ctx, mvn, "-q", "-B", "-f", pom, "dependency:copy-dependencies",
		"-DincludeScope=runtime", "-DoutputDirectory="+libs+".tmp")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("stack: mvn dependency:copy-dependencies: %w\n%s", err, tail(out))
	}
	if err := os.Rename(libs+".tmp", libs); err != nil {
		return "", fmt.Errorf("stack: kafka jar cache: %w", err)
	}
	if err := writeManifest(cache); err != nil {
		return "", err
	}
	log("kafka: jars resolved in %s", time.Since(start).Round(time.Second))
	return libs, nil
}

// The manifest lists "name size" for every jar in libs/, written last, so a
// cache without it (an interrupted resolution) or with a jar missing or cut
// short does not pass.
func writeManifest(cache string) error {
	entries, err := os.ReadDir(filepath.Join(cache, "libs"))
	if err != nil {
		return fmt.Errorf("stack: kafka jar cache: %w", err)
	}
	var b strings.Builder
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			return fmt.Errorf("stack: kafka jar cache: %w", err)
		}
		fmt.Fprintf(&b, "%s %d\n", e.Name(), info.Size())
	}
	return os.WriteFile(filepath.Join(cache, "manifest"), []byte(b.String()), 0o644)
}

func checkManifest(cache string) error {
	data, err := os.ReadFile(filepath.Join(cache, "manifest"))
	if err != nil {
		return err
	}
	pom, err := os.ReadFile(filepath.Join(cache, "pom.xml"))
	if err != nil || string(pom) != string(kafkadist.POM) {
		return errors.New("resolved from another pom.xml")
	}
	broker := false
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		name, size, ok := strings.Cut(line, " ")
		if !ok {
			return fmt.Errorf("manifest line %q", line)
		}
		info, err := os.Stat(filepath.Join(cache, "libs", name))
		if err != nil {
			return fmt.Errorf("%s: %w", name, errors.Unwrap(err))
		}
		if strconv.FormatInt(info.Size(), 10) != size {
			return fmt.Errorf("%s has %d bytes, the manifest says %s", name, info.Size(), size)
		}
		broker = broker || name == "kafka_2.13-"+ApacheVersion+".jar"
	}
	if !broker {
		return errors.New("no broker jar")
	}
	return nil
}

// findJava returns $JAVA_HOME/bin/java, or java on PATH.
func findJava() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		if p := filepath.Join(home, "bin", "java"); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("java"); err == nil {
		return p, nil
	}
	return "", errors.New("stack: Apache Kafka needs a Java 17+ runtime (JAVA_HOME or java on PATH), or use the embedded broker: unset STACK_KAFKA")
}

func isExecutable(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.Mode()&0o111 != 0
}

// reapStaleKafka kills the nodes of throwaway clusters whose owning process
// died without Close (they die with it through Pdeathsig, so this is a
// second line) and removes their dirs.
func reapStaleKafka() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), apacheTempPrefix+"*"))
	for _, dir := range dirs {
		owner, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		if pid, _ := strconv.Atoi(string(owner)); pid > 0 && alive(pid) {
			continue
		}
		pids, _ := filepath.Glob(filepath.Join(dir, "node-*", "node.pid"))
		for _, f := range pids {
			b, _ := os.ReadFile(f)
			if pid, _ := strconv.Atoi(string(b)); pid > 0 && isKafkaProcess(pid) {
				syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck
			}
		}
		os.RemoveAll(dir)
	}
}

func isKafkaProcess(pid int) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), "kafka.Kafka")
}

func properties(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# written by chaos/stack\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, m[k])
	}
	return b.String()
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// log4j2Config sends the broker's log to stdout (the node's broker.log) at
// INFO, with the chatty request and state-change loggers at WARN.
const log4j2Config = `status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = warn
`
