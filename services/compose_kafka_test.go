package services_test

// docker-compose.yml's kafka service, proven with the real broker. No Docker
// engine runs here, so TestComposeKafka does what `docker compose up` with
// the official apache/kafka:4.1.0 image does, with that image's own code:
// the service's environment goes through kafka.docker.KafkaDockerWrapper
// from the 4.1.0 jars (the class the image's launch script runs), the
// broker boots on the server.properties it writes, the topics are created
// as kafka-init creates them, and the system runs on it with the services'
// environment as compose gives it.
//
// How the image turns its environment into server.properties, from
// apache/kafka (scripts as of trunk 1eb7644; the wrapper read in
// core/src/main/scala/kafka/docker/KafkaDockerWrapper.scala and checked
// against the bytecode of kafka_2.13-4.1.0.jar with javap):
//
//   - docker/jvm/Dockerfile: CMD /etc/kafka/docker/run; the distribution's
//     server.properties is copied to /etc/kafka/docker; VOLUME
//     /var/lib/kafka/data, an anonymous volume nothing points log.dirs at.
//   - docker/resources/common-scripts/run sources configureDefaults (it
//     only defaults CLUSTER_ID), then configure (with KAFKA_PROCESS_ROLES
//     set CLUSTER_ID is required; an unset KAFKA_LISTENERS is derived from
//     KAFKA_ADVERTISED_LISTENERS with every host made 0.0.0.0), then
//     docker/jvm/launch.
//   - launch runs `kafka.docker.KafkaDockerWrapper setup --default-configs-dir
//     /etc/kafka/docker --mounted-configs-dir /mnt/shared/config
//     --final-configs-dir /opt/kafka/config`, tolerating "already formatted",
//     then kafka-server-start.sh /opt/kafka/config/server.properties.
//   - The wrapper (getServerConfigsFromEnv) makes every KAFKA_* variable,
//     except the JVM and log4j ones in imageExcludedEnv, a property: the
//     first "KAFKA_" dropped, lower-cased, "_" → ".", then "..." → "-" and
//     ".." → "_" (so ___ is a dash, __ an underscore). With a
//     server.properties mounted in /mnt/shared/config they are appended to
//     it; without, they are the whole file, and the image's default file
//     (the distribution's, log.dirs=/tmp/kraft-combined-logs) is used only
//     when there are none. So with any KAFKA_* set, as here, no image
//     default applies: an unset log.dirs is Kafka's built-in
//     /tmp/kafka-logs. Then it formats the storage: StorageTool format
//     --cluster-id=$CLUSTER_ID -c server.properties.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/pkg/signature"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkainit"
)

// imageExcludedEnv are the KAFKA_* variables the image's wrapper does not
// make properties (Constants.ExcludeServerPropsEnv in kafka 4.1.0): the
// launch scripts' JVM options and the log4j settings.
var imageExcludedEnv = []string{
	"KAFKA_VERSION", "KAFKA_HEAP_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS",
	"KAFKA_JMX_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS",
	"KAFKA_LOG4J_ROOT_LOGLEVEL", "KAFKA_LOG4J_LOGGERS",
	"KAFKA_TOOLS_LOG4J_LOGLEVEL", "KAFKA_JMX_HOSTNAME",
}

// imageServerProperties is the server.properties the apache/kafka image
// writes from env when no file is mounted (see the top of this file).
func imageServerProperties(env map[string]string) map[string]string {
	props := map[string]string{}
	for k, v := range env {
		if !strings.HasPrefix(k, "KAFKA_") || slices.Contains(imageExcludedEnv, k) {
			continue
		}
		key := strings.ToLower(strings.TrimPrefix(k, "KAFKA_"))
		key = strings.ReplaceAll(key, "_", ".")
		key = strings.ReplaceAll(key, "...", "-")
		key = strings.ReplaceAll(key, "..", "_")
		props[key] = v
	}
	return props
}

func TestImageServerProperties(t *testing.T) {
	env := map[string]string{
		"CLUSTER_ID":                           "E0xoLuzoSA-82Cw8DvXKoQ", // no KAFKA_ prefix: the storage format reads it
		"KAFKA_PROCESS_ROLES":                  "broker,controller",
		"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT",
		"KAFKA_LOG_DIRS":                       "/var/lib/kafka/data",
		"KAFKA_FOO___BAR__BAZ":                 "x", // ___ is a dash, __ an underscore
		"KAFKA_HEAP_OPTS":                      "-Xmx1G",
		"KAFKA_LOG4J_ROOT_LOGLEVEL":            "WARN",
		"KAFKA_JMX_HOSTNAME":                   "kafka",
		"LOG_LEVEL":                            "info",
	}
	want := map[string]string{
		"process.roles":                  "broker,controller",
		"listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
		"log.dirs":                       "/var/lib/kafka/data",
		"foo-bar_baz":                    "x",
	}
	require.Equal(t, want, imageServerProperties(env))

	// The same environment through the image's own code, when it is here.
	t.Run("KafkaDockerWrapper", func(t *testing.T) {
		java, libs := stack.RequireApache(t)
		dir := t.TempDir()
		env["KAFKA_LOG_DIRS"] = filepath.Join(dir, "data")
		want["log.dirs"] = env["KAFKA_LOG_DIRS"]
		// The storage format after the properties fails on this partial
		// configuration; the file is written before it.
		out, _ := runWrapper(t.Context(), java, libs, dir, env)
		got, err := readProperties(filepath.Join(dir, "final", "server.properties"))
		require.NoError(t, err, "wrapper output:\n%s", out)
		require.Equal(t, want, got)
	})
}

// composeKafka is the kafka service of docker-compose.yml as the image
// sees it.
type composeKafka struct {
	svc      types.ServiceConfig
	env      map[string]string // the environment, interpolated
	props    map[string]string // imageServerProperties(env)
	logDirs  []string          // log.dirs, paths inside the container
	volumes  map[string]string // log dir → the named volume holding it
	hostAddr string            // the listener clients on the host use, as they write it (localhost:9094)
}

// readComposeKafka reads the kafka service and checks what the fix is for:
// Kafka's data on a named volume, a listener reachable from the host, a
// restart policy, and the services pointed at the listener meant for them.
func readComposeKafka(t *testing.T, p *types.Project) composeKafka {
	t.Helper()
	k := composeKafka{svc: service(t, p, "kafka"), env: map[string]string{}, volumes: map[string]string{}}
	for key, v := range k.svc.Environment {
		if v != nil {
			k.env[key] = *v
		}
	}
	k.props = imageServerProperties(k.env)
	if len(k.props) == 0 {
		t.Fatal("kafka: no KAFKA_* settings, so the image runs its default server.properties, which this test does not model")
	}
	if k.props["process.roles"] != "" && k.env["CLUSTER_ID"] == "" {
		t.Error("kafka: KRaft (KAFKA_PROCESS_ROLES) without CLUSTER_ID: the image refuses to start")
	}
	for _, v := range k.svc.Volumes {
		if strings.HasPrefix(v.Target, "/mnt/shared/config") {
			t.Fatalf("kafka: %s is mounted; the image appends the environment to a server.properties there, which this test does not model", v.Target)
		}
	}

	// Data: every log dir on a named volume.
	if k.props["log.dirs"] == "" {
		t.Errorf("kafka: KAFKA_LOG_DIRS is not set, so the broker writes to Kafka's default /tmp/kafka-logs inside the container " +
			"and `docker compose down` loses every topic; set it to a path on a named volume")
	}
	for _, dir := range strings.Split(k.props["log.dirs"], ",") {
		if dir = strings.TrimSpace(dir); dir == "" {
			continue
		}
		k.logDirs = append(k.logDirs, dir)
		for _, v := range k.svc.Volumes {
			if v.Type == types.VolumeTypeVolume && v.Source != "" && within(dir, v.Target) {
				k.volumes[dir] = v.Source
			}
		}
		if k.volumes[dir] == "" {
			t.Errorf("kafka: log dir %s is on no named volume (volumes: %+v): `docker compose down` loses it", dir, k.svc.Volumes)
		}
	}

	if k.svc.Restart != types.RestartPolicyUnlessStopped {
		t.Errorf("kafka: restart policy %q, want %q like the services", k.svc.Restart, types.RestartPolicyUnlessStopped)
	}

	listeners := listenerMap(t, "listeners", k.props["listeners"])
	advertised := listenerMap(t, "advertised.listeners", k.props["advertised.listeners"])
	protocols := listenerMap(t, "listener.security.protocol.map", strings.ReplaceAll(k.props["listener.security.protocol.map"], ":", "://"))
	for name := range listeners {
		if _, ok := protocols[name]; !ok {
			t.Errorf("kafka: listener %s has no entry in KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", name)
		}
	}
	for name, addr := range advertised {
		if _, ok := listeners[name]; !ok {
			t.Errorf("kafka: advertised listener %s (%s) is not in KAFKA_LISTENERS", name, addr)
		}
	}

	// The host listener: advertised on localhost at a port published on
	// 127.0.0.1 only, to the listener's own port in the container.
	for name, addr := range advertised {
		host, port := splitHostPort(t, addr)
		if host != "localhost" && host != "127.0.0.1" {
			continue
		}
		for _, pc := range k.svc.Ports {
			_, lport := splitHostPort(t, listeners[name])
			if pc.Published == port && fmt.Sprint(pc.Target) == lport {
				if pc.HostIP != "127.0.0.1" {
					t.Errorf("kafka: listener %s is published on %q, want 127.0.0.1 only", name, pc.HostIP)
				}
				k.hostAddr = addr
			}
		}
	}
	if k.hostAddr == "" {
		t.Errorf("kafka: no listener reachable from the host (advertised on localhost at a port published to it; ports %+v, advertised %v)",
			k.svc.Ports, advertised)
	}

	// The services reach an advertised listener named by the service.
	for _, name := range system.Services {
		s := service(t, p, name)
		addr := *s.Environment["KAFKA_BROKERS"]
		host, _ := splitHostPort(t, addr)
		found := false
		for _, a := range advertised {
			found = found || a == addr
		}
		if host != "kafka" || !found {
			t.Errorf("%s: KAFKA_BROKERS=%s is not a listener the kafka service advertises on the network (%v)", name, addr, advertised)
		}
	}
	return k
}

// TestComposeKafkaSettings: the checks of readComposeKafka, without a
// broker, so they run everywhere.
func TestComposeKafkaSettings(t *testing.T) {
	readComposeKafka(t, load(t, composeFile))
}

// within reports whether path p is dir or below it.
func within(p, dir string) bool {
	p, dir = path.Clean(p), path.Clean(dir)
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// listenerMap parses "NAME://host:port,…" into name → host:port.
func listenerMap(t *testing.T, key, v string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, l := range strings.Split(v, ",") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		name, addr, ok := strings.Cut(l, "://")
		if !ok {
			t.Fatalf("kafka: %s: %q is not NAME://host:port", key, l)
		}
		m[name] = addr
	}
	return m
}

func splitHostPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("kafka: %q: %v", addr, err)
	}
	return host, port
}

// hostNet stands in for Docker's network on this machine: a free port on
// 127.0.0.1 for each port the kafka container listens on, and a directory
// for each named volume.
type hostNet struct {
	k       composeKafka
	ports   map[string]string // container port → 127.0.0.1:free port
	volumes string            // <dir>/<volume name> stands in for the volume
}

func newHostNet(t *testing.T, k composeKafka, dir string) *hostNet {
	t.Helper()
	h := &hostNet{k: k, ports: map[string]string{}, volumes: filepath.Join(dir, "volumes")}
	for _, key := range []string{"listeners", "controller.quorum.voters"} {
		for _, l := range strings.Split(k.props[key], ",") {
			_, addr, _ := strings.Cut(l, "://")
			if key == "controller.quorum.voters" {
				_, addr, _ = strings.Cut(l, "@")
			}
			_, port := splitHostPort(t, addr)
			if h.ports[port] == "" {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				h.ports[port] = l.Addr().String()
				l.Close()
			}
		}
	}
	return h
}

// addr maps an address as compose writes it to this machine: the service's
// name (Docker's DNS) or an empty host reach the container's port; localhost
// reaches a port published to the host, and so its target.
func (h *hostNet) addr(t *testing.T, a string) string {
	t.Helper()
	host, port := splitHostPort(t, a)
	switch host {
	case "kafka", "", "0.0.0.0":
	case "localhost", "127.0.0.1":
		target := ""
		for _, pc := range h.k.svc.Ports {
			if pc.Published == port {
				target = fmt.Sprint(pc.Target)
			}
		}
		if target == "" {
			t.Fatalf("kafka: %s: port %s is not published to the host", a, port)
		}
		port = target
	default:
		t.Fatalf("kafka: %s: unknown host %q", a, host)
	}
	if h.ports[port] == "" {
		t.Fatalf("kafka: %s: nothing in the container listens on port %s", a, port)
	}
	return h.ports[port]
}

// logDir is where a log dir inside the container lands on this machine.
func (h *hostNet) logDir(dir string) string {
	vol := h.k.volumes[dir]
	var target string
	for _, v := range h.k.svc.Volumes {
		if v.Source == vol && within(dir, v.Target) {
			target = v.Target
		}
	}
	return filepath.Join(h.volumes, vol, strings.TrimPrefix(path.Clean(dir), path.Clean(target)))
}

// brokerEnv is the kafka service's environment with only what must change
// to run on this machine rewritten: the addresses in KAFKA_LISTENERS,
// KAFKA_ADVERTISED_LISTENERS and KAFKA_CONTROLLER_QUORUM_VOTERS (kafka,
// localhost and the empty host become 127.0.0.1 at the free port standing
// for the container's port), and KAFKA_LOG_DIRS (the path inside the
// container becomes the same path in the volume's stand-in directory).
// Everything else is the file's, verbatim.
func (h *hostNet) brokerEnv(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{}
	for k, v := range h.k.env {
		env[k] = v
	}
	for _, key := range []string{"KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS"} {
		var out []string
		for _, l := range strings.Split(env[key], ",") {
			name, addr, _ := strings.Cut(l, "://")
			out = append(out, name+"://"+h.addr(t, addr))
		}
		env[key] = strings.Join(out, ",")
	}
	var voters []string
	for _, v := range strings.Split(env["KAFKA_CONTROLLER_QUORUM_VOTERS"], ",") {
		id, addr, _ := strings.Cut(v, "@")
		voters = append(voters, id+"@"+h.addr(t, addr))
	}
	env["KAFKA_CONTROLLER_QUORUM_VOTERS"] = strings.Join(voters, ",")
	var dirs []string
	for _, d := range h.k.logDirs {
		dirs = append(dirs, h.logDir(d))
	}
	env["KAFKA_LOG_DIRS"] = strings.Join(dirs, ",")
	return env
}

// brokerRewrites are the only properties brokerEnv changes.
var brokerRewrites = []string{"listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs"}

// wrapperLog4j stands in for the distribution's config/log4j2.yaml, which
// the image keeps in /etc/kafka/docker: the broker's log at INFO on stdout.
const wrapperLog4j = `Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.request.logger
        level: WARN
      - name: state.change.logger
        level: WARN
`

// runWrapper runs the image's configuration step as launch does, with env
// as the container's whole environment: <dir>/default stands for
// /etc/kafka/docker, <dir>/mounted for /mnt/shared/config (empty: compose
// mounts nothing there), <dir>/final for /opt/kafka/config.
func runWrapper(ctx context.Context, java, libs, dir string, env map[string]string) (string, error) {
	for _, d := range []string{"default", "mounted", "final"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "default", "log4j2.yaml"), []byte(wrapperLog4j), 0o644); err != nil {
		return "", err
	}
	// A short-lived JVM: C1 only and the serial collector start it faster.
	cmd := exec.CommandContext(ctx, java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", filepath.Join(libs, "*"),
		"kafka.docker.KafkaDockerWrapper", "setup",
		"--default-configs-dir", filepath.Join(dir, "default"),
		"--mounted-configs-dir", filepath.Join(dir, "mounted"),
		"--final-configs-dir", filepath.Join(dir, "final"))
	cmd.Env = []string{}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// readProperties reads key=value lines, as the wrapper writes them.
func readProperties(file string) (map[string]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	props := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: line %q", file, line)
		}
		props[k] = v
	}
	return props, sc.Err()
}

// broker is the kafka.Kafka JVM, what kafka-server-start.sh execs.
type broker struct {
	java, libs, conf, log string
	cmd                   *exec.Cmd
	exited                chan struct{}
}

func (b *broker) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(b.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	// The image's heap is kafka-server-start.sh's 1 GiB; half is plenty
	// here, beside Postgres and the services on two cores.
	b.cmd = exec.Command(b.java, "-Xmx512m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile="+filepath.Join(b.conf, "log4j2.yaml"),
		"-cp", filepath.Join(b.libs, "*"), "kafka.Kafka", filepath.Join(b.conf, "server.properties"))
	b.cmd.Stdout, b.cmd.Stderr = logf, logf
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, b.cmd.Start())
	b.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		cmd.Wait() //nolint:errcheck // killed on purpose
		logf.Close()
		close(exited)
	}(b.cmd, b.exited)
}

// kill SIGKILLs the broker.
func (b *broker) kill() {
	if b.cmd == nil {
		return
	}
	b.cmd.Process.Kill() //nolint:errcheck // may be gone
	<-b.exited
}

// stop is `docker compose down`'s stop: SIGTERM, and SIGKILL when the
// broker has not exited after compose's default 10 s stop timeout.
func (b *broker) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		t.Log("the broker did not stop within 10 s of SIGTERM; killing it, as Docker would")
		b.kill()
	}
}

// waitReady waits until the broker answers a metadata request at addr and
// lists itself (the compose healthcheck's kafka-broker-api-versions.sh
// asks less), failing when the JVM exits first.
func (b *broker) waitReady(t *testing.T, ctx context.Context, addr string) {
	t.Helper()
	var last error
	for {
		select {
		case <-b.exited:
			logs, _ := os.ReadFile(b.log)
			t.Fatalf("the broker exited while starting; its log:\n%s", tail(logs, 4000))
		default:
		}
		cfg := stack.SaramaConfig()
		cfg.Net.DialTimeout = 2 * time.Second
		cfg.Metadata.Retry.Max = 0
		c, err := sarama.NewClient([]string{addr}, cfg)
		if err == nil {
			n := len(c.Brokers())
			c.Close()
			if n > 0 {
				return
			}
			err = errors.New("no broker in the metadata")
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("the broker did not answer at %s: %v (log: %s)", addr, last, b.log)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// readKafkaInit is the kafka-init job's plan, from the service's command
// and environment as compose gives them (cmd/kafka-init parses the same).
func readKafkaInit(t *testing.T, p *types.Project) kafkainit.Plan {
	t.Helper()
	svc := service(t, p, "kafka-init")
	plan, err := kafkainit.Parse(svc.Command, func(key string) string {
		if v := svc.Environment[key]; v != nil {
			return *v
		}
		return ""
	})
	require.NoError(t, err, "kafka-init's command and environment")
	require.NotEmpty(t, plan.Topics)
	require.False(t, plan.Admin.Empty(), "kafka-init logs in as no one: the broker asks every client for a login")
	require.Len(t, plan.Principals, len(kafkainit.Names), "kafka-init's principals")
	return plan
}

// TestComposeKafka stands in for `docker compose up` with the official
// apache/kafka image, which cannot run on a machine without a Docker engine
// (see the top of this file): the kafka service's settings, through the
// image's own configuration code, boot the real broker, kafka-init's topics
// are created on it, and orders and inventory run a load on it with the
// environment compose gives them. Kafka's data must land on the named
// volume and outlive the broker, as it must outlive `docker compose down`.
func TestComposeKafka(t *testing.T) {
	java, libs := stack.RequireApache(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	p := load(t, composeFile)
	k := readComposeKafka(t, p)
	if t.Failed() {
		t.FailNow()
	}
	ki := readKafkaInit(t, p)
	dir := t.TempDir()
	h := newHostNet(t, k, dir)

	// The container's configuration step, with only the host's addresses
	// and the volume's place rewritten; everything else is the file's.
	env := h.brokerEnv(t)
	start := time.Now()
	out, err := runWrapper(ctx, java, libs, filepath.Join(dir, "kafka"), env)
	require.NoError(t, err, "KafkaDockerWrapper setup:\n%s", out)
	conf := filepath.Join(dir, "kafka", "final")
	got, err := readProperties(filepath.Join(conf, "server.properties"))
	require.NoError(t, err)
	require.Equal(t, imageServerProperties(env), got, "the wrapper's server.properties is not what imageServerProperties says")
	for key, v := range k.props {
		if !slices.Contains(brokerRewrites, key) {
			require.Equal(t, v, got[key], "%s is not docker-compose.yml's", key)
		}
	}
	require.Len(t, got, len(k.props))
	t.Logf("server.properties (%s): %v", time.Since(start).Round(time.Millisecond), got)

	inNetwork := h.addr(t, ki.Brokers[0]) // what the containers reach as kafka:9092
	b := &broker{java: java, libs: libs, conf: conf, log: filepath.Join(dir, "broker.log")}
	b.start(t)
	t.Cleanup(b.kill)
	pg, err := pgtest.Start(ctx) // while the broker boots
	require.NoError(t, err)
	t.Cleanup(func() { pg.Stop() }) //nolint:errcheck // tearing down
	// The harness's own clients (its checks, the replay) log in as admin,
	// as kafka-init does; the services as the principals it made.
	for _, kv := range ki.Admin.Env() {
		key, v, _ := strings.Cut(kv, "=")
		t.Setenv(key, v)
	}
	kafkaconf.UseCredentials(ki.Admin)
	t.Cleanup(kafkaconf.ForgetCredentials)
	b.waitReady(t, ctx, inNetwork)
	t.Logf("broker ready after %s", time.Since(start).Round(time.Millisecond))
	// The job, as its container runs it, with kafka:9092 mapped.
	plan := ki
	plan.Brokers = []string{inNetwork}
	var initOut strings.Builder
	require.NoError(t, kafkainit.Run(ctx, plan, &initOut), "kafka-init:\n%s", initOut.String())
	t.Logf("kafka-init:\n%s", initOut.String())
	checkACLs(t, p, inNetwork, plan)
	checkACLs(t, p, h.addr(t, k.hostAddr), plan) // and on the host's listener

	// The services' environment as compose gives it. Only DATABASE_URL (the
	// test's Postgres), KAFKA_BROKERS (kafka:9092 mapped like the broker's
	// own addresses), HTTP_ADDR (a free port) and PROVIDER_URL (the
	// provider system.Start runs) differ.
	const prefix = "compose_"
	envFor := map[string][]string{}
	pg.DropWhenDone(t, prefix+"provider")
	for _, name := range system.Services {
		pg.DropWhenDone(t, prefix+name)
		for key, v := range service(t, p, name).Environment {
			switch key {
			case "DATABASE_URL", "HTTP_ADDR", "PROVIDER_URL":
			case "CONSOLE_ADDR": // each in a container of its own there; here, one host
				addr, err := procs.FreeAddr()
				require.NoError(t, err)
				envFor[name] = append(envFor[name], key+"="+addr)
			case "KAFKA_BROKERS":
				require.Equal(t, strings.Join(ki.Brokers, ","), *v, "%s and kafka-init reach Kafka differently", name)
				t.Setenv("KAFKA_BROKERS", h.addr(t, *v)) // system.Start hands it to the services
			default:
				envFor[name] = append(envFor[name], key+"="+*v)
			}
		}
	}
	// The services sign with the keys compose gives them (.env's), not
	// with keys of the system's own.
	sys, err := system.Start(ctx, system.Options{Postgres: pg, DBPrefix: prefix, Work: filepath.Join(dir, "system"), EnvFor: envFor, Log: t.Logf, Unsigned: true, OwnLogins: true})
	require.NoError(t, err)
	t.Cleanup(sys.Stop)
	sys.Client.Token = *service(t, p, "orders").Environment["HTTP_TOKEN"] // as the demo container sends it
	// Without it, compose's services refuse every state-changing request.
	for _, name := range system.Services {
		resp, err := http.Post("http://"+sys.Procs[name][0].Addr+"/orders", "application/json", strings.NewReader(`{}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s: a POST without HTTP_TOKEN", name)
	}

	skus := loadgen.SKUs(10)
	stock := loadgen.StockFor(200, skus)
	require.NoError(t, sys.Client.SeedStock(ctx, stock))
	res, err := loadgen.Run(ctx, sys.Client, skus, loadgen.Plan{Orders: 200, Concurrency: 8, DoubleSubmit: 10, Seed: 1})
	require.NoError(t, err)
	require.Len(t, res.Paid, 200)

	// From the host, through the published listener (localhost:9094): the
	// demo's replay, which the inventory inbox must suppress.
	fromHost := h.addr(t, k.hostAddr)
	ordersKey, err := signature.ParseKey(*service(t, p, "orders").Environment["SIGNING_KEY"])
	require.NoError(t, err)
	replayOrderPaid(t, ctx, sys, fromHost, ordersKey)

	report, err := judge.Wait(ctx, sys.Pools["orders"], sys.Pools["inventory"], stock, res.Client(),
		func(r judge.Report) bool { return judge.Settled(200)(r) && r.DuplicatesSuppressed > 0 },
		func(r judge.Report) { t.Logf("waiting: %d of %d settled", r.Reserved+r.Rejected, r.OrdersPaid) })
	require.NoError(t, err, "invariants: %+v", report.Invariants)
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)
	require.Equal(t, 200, report.OrdersPaid)
	require.Equal(t, 200, report.Reserved+report.Rejected)
	require.NoError(t, sys.StopServices(30*time.Second), "graceful shutdown")
	t.Logf("200 orders settled through the compose broker after %s", time.Since(start).Round(time.Millisecond))

	// Kafka's data is on the volume: the cluster id and every partition.
	for _, d := range k.logDirs {
		meta, err := readProperties(filepath.Join(h.logDir(d), "meta.properties"))
		require.NoError(t, err, "log dir %s (volume %s) was not formatted", d, k.volumes[d])
		require.Equal(t, k.env["CLUSTER_ID"], meta["cluster.id"])
	}
	for _, topic := range ki.Topics {
		for i := range ki.Partitions {
			found := false
			for _, d := range k.logDirs {
				_, err := os.Stat(filepath.Join(h.logDir(d), fmt.Sprintf("%s-%d", topic, i)))
				found = found || err == nil
			}
			require.True(t, found, "partition %s-%d is on no volume", topic, i)
		}
	}

	// And it outlives the broker, as it must outlive `docker compose down`:
	// kill it, configure again as the image does on every start (the
	// storage is already formatted), start it on the same volume.
	before := kafkaState(t, fromHost, ki.Topics)
	require.NotContains(t, before, "error", "reading offsets before the restart")
	stopped := time.Now()
	b.stop(t)
	t.Logf("broker stopped in %s", time.Since(stopped).Round(time.Millisecond))
	out, err = runWrapper(ctx, java, libs, filepath.Join(dir, "kafka"), env)
	if err != nil && !strings.Contains(out, "already formatted") {
		t.Fatalf("KafkaDockerWrapper setup on the volume:\n%s", out)
	}
	b.start(t)
	b.waitReady(t, ctx, inNetwork)
	t.Logf("broker ready again after %s", time.Since(stopped).Round(time.Millisecond))
	loadCtx, cancelLoad := context.WithTimeout(ctx, time.Minute)
	defer cancelLoad()
	after := kafkaState(t, fromHost, ki.Topics)
	for after["error"] != 0 { // until the partitions and the groups have loaded
		select {
		case <-loadCtx.Done():
			t.Fatalf("after the broker restarted on the volume, its topics and groups could not be read within a minute (before: %v)", before)
		case <-time.After(250 * time.Millisecond):
		}
		after = kafkaState(t, fromHost, ki.Topics)
	}
	require.Equal(t, before, after, "end and committed offsets after the broker restarted on the volume")
	require.Positive(t, before["orders.events"], "no message reached the volume")
	t.Logf("after a restart on the volume: %v; total %s", after, time.Since(start).Round(time.Millisecond))
}

// kafkaState sums each topic's end offsets, and each consumer group's
// committed offsets, as "topic" and "group/topic"; {"error": -1} when the
// broker cannot answer yet.
func kafkaState(t *testing.T, bootstrap string, topics []string) map[string]int64 {
	t.Helper()
	state := map[string]int64{}
	cfg := stack.SaramaConfig()
	cfg.Net.DialTimeout = 2 * time.Second
	client, err := sarama.NewClient([]string{bootstrap}, cfg)
	if err != nil {
		return map[string]int64{"error": -1}
	}
	defer client.Close()
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if err != nil {
			return map[string]int64{"error": -1}
		}
		for _, p := range parts {
			off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return map[string]int64{"error": -1}
			}
			state[topic] += off
		}
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return map[string]int64{"error": -1}
	}
	for _, group := range system.Services {
		offs, err := admin.ListConsumerGroupOffsets(group, nil)
		if err != nil || offs.Err != sarama.ErrNoError { // e.g. the coordinator still loading
			return map[string]int64{"error": -1}
		}
		for topic, parts := range offs.Blocks {
			for _, b := range parts {
				if b.Err != sarama.ErrNoError {
					return map[string]int64{"error": -1}
				}
				if b.Offset > 0 {
					state[group+"/"+topic] += b.Offset
				}
			}
		}
	}
	return state
}

// replayOrderPaid publishes an already-published OrderPaid again with its
// id, key and payload, as a relay that crashed before marking its row would
// (cmd/demo does the same), signed with orders' key as the relay's copy was.
func replayOrderPaid(t *testing.T, ctx context.Context, sys *system.System, bootstrap string, ordersKey signature.Key) {
	t.Helper()
	var id, key string
	var payload []byte
	require.NoError(t, sys.Pools["orders"].QueryRow(ctx, `
		SELECT message_id::text, partition_key, payload FROM outbox_messages
		WHERE topic = $1 AND published_at IS NOT NULL AND `+events.OutboxType+` = $2 ORDER BY id LIMIT 1`, events.TopicOrders, events.TypeOrderPaid).Scan(&id, &key, &payload))
	msg := message.NewMessage(id, payload)
	msg.Metadata.Set(outbox.KeyMetadata, key)
	signature.Sign(ordersKey, events.TopicOrders, key, msg)
	require.NoError(t, kafkaconf.PublishOnce([]string{bootstrap}, stack.SaramaConfig(), events.TopicOrders, msg))
}

// checkACLs: the compose broker refuses, on the listener at addr, a client
// without a login, with a wrong password, or writing where its principal
// may not. Nothing is written: each attempt is refused.
func checkACLs(t *testing.T, p *types.Project, addr string, plan kafkainit.Plan) {
	t.Helper()
	login := map[string]kafkaconf.Credentials{}
	for _, pr := range plan.Principals {
		login[pr.Login.Username] = pr.Login
	}
	// The services, the demo and the dashboard log in as the principals
	// kafka-init made, with the passwords it was given.
	for _, name := range []string{"orders", "inventory", "demo", "dashboard"} {
		env := service(t, p, name).Environment
		user, pw := env[kafkaconf.EnvUsername], env[kafkaconf.EnvPassword]
		require.True(t, user != nil && pw != nil, "%s: no KAFKA_SASL_USERNAME/PASSWORD: the broker refuses it", name)
		require.Equal(t, name, *user, "%s logs in as another principal", name)
		require.Equal(t, login[name].Password, *pw, "%s: its password is not the one kafka-init set", name)
	}
	refused := func(what string, creds kafkaconf.Credentials, topic string, want error) {
		t.Helper()
		err := produceTo(addr, creds, topic)
		require.Error(t, err, "%s: the broker let it write %s", what, topic)
		if want != nil {
			require.ErrorIs(t, err, want, "%s", what)
		}
		t.Logf("%s writing %s: refused: %v", what, topic, err)
	}
	refused("no login", kafkaconf.Credentials{}, events.TopicOrders, nil)
	refused("orders with a wrong password", kafkaconf.Credentials{Username: "orders", Password: "not-" + login["orders"].Password}, events.TopicOrders, sarama.ErrSASLAuthenticationFailed)
	refused("admin's PLAIN password over SCRAM", kafkaconf.Credentials{Username: "admin", Password: plan.Admin.Password}, events.TopicOrders, sarama.ErrSASLAuthenticationFailed)
	refused("orders", login["orders"], events.TopicInventory, sarama.ErrTopicAuthorizationFailed)
	refused("inventory", login["inventory"], events.TopicOrders, sarama.ErrTopicAuthorizationFailed)
	refused("demo", login["demo"], events.TopicInventory, sarama.ErrTopicAuthorizationFailed)
	refused("dashboard", login["dashboard"], events.TopicOrders, sarama.ErrTopicAuthorizationFailed)

	// What the dashboard may do, it can: read a topic's end offsets. (The
	// demo's one right, writing orders.events, is used by its replay in
	// make compose-ci; here it would put a record before the run.)
	client, err := sarama.NewClient([]string{addr}, kafkaconf.SaramaAs(login["dashboard"]))
	require.NoError(t, err, "dashboard's login")
	defer client.Close()
	_, err = client.GetOffset(events.TopicOrders, 0, sarama.OffsetNewest)
	require.NoError(t, err, "dashboard reading the end offset of %s", events.TopicOrders)
}

// produceTo sends one record to topic as creds.
func produceTo(addr string, creds kafkaconf.Credentials, topic string) error {
	conf := kafkaconf.SaramaAs(creds)
	conf.Net.DialTimeout = 3 * time.Second
	conf.Metadata.Retry.Max = 1
	conf.Metadata.Retry.Backoff = 100 * time.Millisecond
	conf.Producer.Retry.Max = 0
	conf.Metadata.AllowAutoTopicCreation = false
	p, err := sarama.NewSyncProducer([]string{addr}, conf)
	if err != nil {
		return err
	}
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("x")})
	return err
}
