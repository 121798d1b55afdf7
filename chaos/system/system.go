// Package system starts the whole example system on this machine: Postgres
// and a Kafka-protocol broker from chaos/stack, one database per service,
// orders and inventory as real OS processes, any number of replicas each,
// and the payment provider stand-in orders captures payments at, a process
// with a database of its own.
// The demo, the end-to-end tests and the chaos harness all start it here.
package system

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/pkg/signature"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// AuditGraceDefault is Options.AuditGrace's default.
const AuditGraceDefault = 10 * time.Second

// Services are the two example services, in start order.
var Services = []string{"orders", "inventory"}

// Options configures Start.
type Options struct {
	// Work is where binaries and logs go. Defaults to a new temp dir.
	Work string
	// Replicas per service. Defaults to 1 each.
	Replicas map[string]int
	// Env is added to every service process; EnvFor to one service's.
	Env    []string
	EnvFor map[string][]string
	// EnvHook is set on every service process (see procs.Proc.EnvHook).
	EnvHook func(*procs.Proc) []string
	// ProviderEnv is added to the payment provider's environment (its
	// faults: PROVIDER_FAIL_RATE, PROVIDER_LOST_RESPONSE_RATE, ...).
	ProviderEnv []string
	// OwnLogins: the services bring their Kafka logins in EnvFor
	// (KAFKA_SASL_*, principals someone else made, as docker-compose.yml's
	// kafka-init does); Start creates none.
	OwnLogins bool
	// Kafka configures the embedded broker (ignored with KAFKA_BROKERS).
	Kafka stack.KafkaOptions
	// Prepare, when set, runs once the databases exist and before anything
	// starts on them: a test that shapes their tables first.
	Prepare func(ctx context.Context, pools map[string]*pgxpool.Pool) error
	// DBPrefix prefixes the two database names, so several systems can
	// share one Postgres. Defaults to "".
	DBPrefix string
	// Postgres, when set, is used instead of starting one: a server of the
	// caller's, or a replicated cluster (stack.PatroniCluster).
	Postgres Postgres
	// ServiceDBURL, when set, rewrites the database URL the services are
	// given (e.g. to a TCP proxy in front of Postgres); Pools and DBURL keep
	// the direct one.
	ServiceDBURL func(url string) string
	// WithoutAuditor starts no auditor (a benchmark of the relays alone).
	WithoutAuditor bool
	// AuditGrace is the auditor's grace period (AUDIT_GRACE): how old an
	// order, decision or sale must be before it is examined. Defaults to
	// 10s: a run's orders settle in seconds, and a run ends soon after.
	AuditGrace time.Duration
	// Log receives one line per step. Defaults to io.Discard.
	Log func(format string, args ...any)
	// Unsigned runs the services without signing keys. By default each
	// service gets a signing key of its own (SIGNING_KEY) and the other's
	// as its trusted key (TRUSTED_KEYS): events are signed by their
	// producer's relay and verified by their consumer's inbox
	// (pkg/signature), so a record written by anyone else is quarantined.
	// System.Keys holds the keys; SignAsProducer signs a record the way
	// its topic's producer would. Only a test of what unsigned looks like
	// (chaos/e2e/forged_test.go's control) or a comparison with a relay that
	// cannot sign (the benchmark's textbook relay) sets it.
	Unsigned bool
}

// Postgres is the database the system runs on: one throwaway server
// (pgtest.Server, the default) or a replicated cluster that fails over
// (stack.PatroniCluster).
type Postgres interface {
	// CreateDatabase creates a database and returns its URL.
	CreateDatabase(ctx context.Context, name string) (string, error)
	// External reports a database the system did not start (DATABASE_URL).
	External() bool
	// Dir is where its data and logs are.
	Dir() string
	// Restart stops every server at once, without a shutdown (a power cut),
	// and starts them again.
	Restart(ctx context.Context) error
	// Stop stops it and removes what it wrote.
	Stop() error
}

// System is a started system.
type System struct {
	Work     string
	PG       Postgres
	Kafka    *stack.Kafka
	DBURL    map[string]string        // service (and "provider") → database URL
	Pools    map[string]*pgxpool.Pool // service (and "provider") → pool, for checks
	Procs    map[string][]*procs.Proc // service → replicas
	Provider *procs.Proc              // the payment provider stand-in
	Auditor  *procs.Proc              // services/auditor, on a database of its own ("audit" in DBURL and Pools); nil WithoutAuditor
	// AuditGrace is the auditor's grace period (Options.AuditGrace).
	AuditGrace time.Duration
	Client     *loadgen.Client
	Keys       map[string]signature.Key         // service → its signing key (none with Options.Unsigned)
	Logins     map[string]kafkaconf.Credentials // service → its Kafka principal's login (Grants)
	ownPG      bool
	logFiles   []*os.File
}

// Topics are the topics the system uses; the embedded broker seeds them.
var Topics = []string{events.TopicOrders, events.TopicInventory, "orders.dlq", "inventory.dlq", kafkaconf.RedriveTopic("orders"), kafkaconf.RedriveTopic("inventory")}

// Start builds the services, starts the infrastructure and every replica,
// and waits until all are ready. On error it stops what it started.
func Start(ctx context.Context, opts Options) (_ *System, err error) {
	log := opts.Log
	if log == nil {
		log = func(string, ...any) {}
	}
	s := &System{Work: opts.Work, DBURL: map[string]string{}, Pools: map[string]*pgxpool.Pool{}, Procs: map[string][]*procs.Proc{}}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if s.Work == "" {
		if s.Work, err = os.MkdirTemp("", "outbox-system-"); err != nil {
			return nil, err
		}
	}
	log("building services into %s", s.Work)
	bins, err := procs.Build(ctx, s.Work, "./services/orders", "./services/inventory", "./cmd/provider", "./services/auditor")
	if err != nil {
		return nil, err
	}

	if s.PG = opts.Postgres; s.PG == nil {
		pg, err := pgtest.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("starting postgres: %w", err)
		}
		s.PG, s.ownPG = pg, true
	}
	if s.PG.External() {
		log("postgres: DATABASE_URL")
	} else {
		log("postgres: in %s", s.PG.Dir()) // a throwaway server, or the replicated cluster the caller started
	}
	for _, name := range slices.Concat(Services, []string{"provider", "audit"}) {
		url, err := s.PG.CreateDatabase(ctx, opts.DBPrefix+name)
		if err != nil {
			return nil, err
		}
		s.DBURL[name] = url
		if s.Pools[name], err = pgxpool.New(ctx, url); err != nil {
			return nil, err
		}
	}
	if opts.Prepare != nil {
		if err := opts.Prepare(ctx, s.Pools); err != nil {
			return nil, fmt.Errorf("preparing the databases: %w", err)
		}
	}

	kopts := opts.Kafka
	kopts.Topics = append(kopts.Topics, Topics...)
	if s.Kafka, err = stack.StartKafka(ctx, kopts); err != nil {
		return nil, fmt.Errorf("starting kafka: %w", err)
	}
	log("kafka: %s at %v", s.Kafka.Describe(), s.Kafka.Brokers())
	s.Logins = map[string]kafkaconf.Credentials{}
	for _, name := range Services {
		if opts.OwnLogins {
			break
		}
		if s.Logins[name], err = s.Kafka.AddPrincipal(ctx, name, Grants(name)...); err != nil {
			return nil, err
		}
	}
	if s.Kafka.Authenticated() {
		// A client of the operator's own (kcat, a script, an audit) logs in
		// with the harness's login: source this file.
		login := filepath.Join(s.Work, "kafka-admin.env")
		var file strings.Builder
		for _, kv := range append([]string{"KAFKA_BROKERS=" + strings.Join(s.Kafka.Brokers(), ",")}, s.Kafka.Admin().Env()...) {
			fmt.Fprintf(&file, "export %s\n", kv) // `. kafka-admin.env`, then inboxctl, outboxctl, the dashboard log in
		}
		if err := os.WriteFile(login, []byte(file.String()), 0o600); err != nil {
			return nil, err
		}
		log("kafka: SASL/SCRAM and ACLs: orders and inventory log in as principals of their own, each may write only its own topics; the superuser's login is in %s", login)
	}

	if err := s.startProvider(bins["provider"], opts.ProviderEnv); err != nil {
		return nil, err
	}
	signEnv := map[string][]string{}
	if !opts.Unsigned {
		if s.Keys, signEnv, err = newKeys(); err != nil {
			return nil, err
		}
	}
	var urls = map[string][]string{}
	for _, name := range Services {
		n := max(1, opts.Replicas[name])
		for i := 1; i <= n; i++ {
			addr, err := procs.FreeAddr()
			if err != nil {
				return nil, err
			}
			pname := name
			if n > 1 {
				pname = fmt.Sprintf("%s-%d", name, i)
			}
			f, err := os.Create(filepath.Join(s.Work, pname+".log"))
			if err != nil {
				return nil, err
			}
			s.logFiles = append(s.logFiles, f)
			dbURL := s.DBURL[name]
			if opts.ServiceDBURL != nil {
				dbURL = opts.ServiceDBURL(dbURL)
			}
			env := append([]string{
				// They listen on loopback: a credential exported in the
				// shell (for the dashboard, say) is not theirs, and the
				// load generator sends none. Options.Env or EnvFor may set one.
				"HTTP_TOKEN=", "PROVIDER_TOKEN=",
				"DATABASE_URL=" + dbURL,
				"KAFKA_BROKERS=" + strings.Join(s.Kafka.Brokers(), ","),
			}, s.Logins[name].Env()...)
			env = append(env, opts.Env...)
			if name == "orders" {
				env = append(env, "PROVIDER_URL=http://"+s.Provider.Addr)
			}
			env = append(env, signEnv[name]...)
			p := &procs.Proc{Service: name, Name: pname, Bin: bins[name], Addr: addr, Log: f, Env: append(env, opts.EnvFor[name]...), EnvHook: opts.EnvHook}
			if err := p.Start(); err != nil {
				return nil, err
			}
			s.Procs[name] = append(s.Procs[name], p)
			urls[name] = append(urls[name], "http://"+addr)
		}
	}
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if s.AuditGrace = opts.AuditGrace; s.AuditGrace == 0 {
		s.AuditGrace = AuditGraceDefault
	}
	ready := append(s.All(), s.Provider)
	if !opts.WithoutAuditor {
		if err := s.startAuditor(bins["auditor"], urls["orders"][0], envValue(append(opts.Env, opts.EnvFor["orders"]...), "HTTP_TOKEN")); err != nil {
			return nil, err
		}
		ready = append(ready, s.Auditor)
	}
	for _, p := range ready {
		if err := p.WaitReady(readyCtx); err != nil {
			return nil, fmt.Errorf("%w (see %s)", err, filepath.Join(s.Work, p.Name+".log"))
		}
		log("%s ready at http://%s (pid %d)", p.Name, p.Addr, p.Pid())
	}
	s.Client = loadgen.NewClient(urls["orders"], urls["inventory"])
	return s, nil
}

// startProvider starts the payment provider on its own database.
func (s *System) startProvider(bin string, env []string) error {
	addr, err := procs.FreeAddr()
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(s.Work, "provider.log"))
	if err != nil {
		return err
	}
	s.logFiles = append(s.logFiles, f)
	s.Provider = &procs.Proc{Service: "provider", Name: "provider", Bin: bin, Addr: addr, Log: f,
		Env: append([]string{"HTTP_TOKEN=", "PROVIDER_DATABASE_URL=" + s.DBURL["provider"]}, env...)}
	return s.Provider.Start()
}

// startAuditor starts services/auditor over the services' databases,
// its state in its own, its repairs asked of orders at ordersURL.
func (s *System) startAuditor(bin, ordersURL, ordersToken string) error {
	addr, err := procs.FreeAddr()
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(s.Work, "auditor.log"))
	if err != nil {
		return err
	}
	s.logFiles = append(s.logFiles, f)
	s.Auditor = &procs.Proc{Service: "auditor", Name: "auditor", Bin: bin, Addr: addr, Log: f,
		Env: []string{"ORDERS_DATABASE_URL=" + s.DBURL["orders"], "INVENTORY_DATABASE_URL=" + s.DBURL["inventory"],
			"AUDIT_DATABASE_URL=" + s.DBURL["audit"], "AUDIT_GRACE=" + s.AuditGrace.String(), "AUDIT_INTERVAL=1s",
			"ORDERS_API_URL=" + ordersURL, "ORDERS_API_TOKEN=" + ordersToken}}
	return s.Auditor.Start()
}

// envValue is the value the last of env's NAME=value entries gives name
// ("" when none does).
func envValue(env []string, name string) string {
	v := ""
	for _, e := range env {
		if k, val, ok := strings.Cut(e, "="); ok && k == name {
			v = val
		}
	}
	return v
}

// All returns every service process (the provider is not one).
func (s *System) All() []*procs.Proc {
	var all []*procs.Proc
	for _, name := range Services {
		all = append(all, s.Procs[name]...)
	}
	return all
}

// StopServices stops every service process gracefully and reports the
// first that did not exit cleanly.
func (s *System) StopServices(timeout time.Duration) error {
	var errs []error
	for _, p := range s.All() {
		if err := p.Stop(timeout); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Stop kills what is left and tears the infrastructure down.
func (s *System) Stop() {
	for _, p := range s.All() {
		p.Stop(5 * time.Second) //nolint:errcheck // tearing down
	}
	for _, p := range []*procs.Proc{s.Provider, s.Auditor} {
		if p != nil {
			p.Stop(5 * time.Second) //nolint:errcheck // tearing down
		}
	}
	for _, p := range s.Pools {
		p.Close()
	}
	if s.Kafka != nil {
		s.Kafka.Close()
	}
	if s.PG != nil && s.ownPG {
		s.PG.Stop() //nolint:errcheck
	}
	for _, f := range s.logFiles {
		f.Close()
	}
}

// Supervise restarts every service process that exits, after delay, until
// ctx ends: what a container orchestrator does (procs.Supervise). A process
// stopped on purpose (Proc.Stop) stays down until started. onRestart, when
// set, is called after each restart. The provider is restarted too.
func (s *System) Supervise(ctx context.Context, delay func() time.Duration, onRestart func(*procs.Proc)) {
	procs.Supervise(ctx, append(s.All(), s.Provider), procs.Supervision{Delay: delay, OnRestart: onRestart})
}

// Producers names the service whose relay publishes each events topic.
var Producers = map[string]string{events.TopicOrders: "orders", events.TopicInventory: "inventory"}

// Grants are what service's Kafka principal may do, and all it may do
// (kafkaconf.ServiceGrants): write the topics named "<service>.", read the
// events topics the other services produce and its redrive topic, its own
// groups, the brokers' settings. docker-compose.yml's kafka-init grants the same.
func Grants(service string) []stack.Grant {
	var consumes []string
	for _, t := range slices.Sorted(maps.Keys(Producers)) {
		if Producers[t] != service {
			consumes = append(consumes, t)
		}
	}
	return kafkaconf.ServiceGrants(service, consumes...)
}

// SignAsProducer signs msg as the producer of topic would (its relay signs
// what it publishes), when the system signs; it does nothing otherwise, or
// for a topic no service produces. A test or a harness that puts a record
// on a topic to stand for the producer's own (a replay of a published
// event, a producer's bug) signs it so; a forgery does not.
func (s *System) SignAsProducer(topic string, msg *message.Message) {
	if k, ok := s.Keys[Producers[topic]]; ok {
		signature.Sign(k, topic, msg.Metadata.Get(outbox.KeyMetadata), msg)
	}
}

// newKeys makes a random signing key per service, and each service's
// SIGNING_KEY and TRUSTED_KEYS: its own key, and the key of the other, whose
// events it consumes.
func newKeys() (map[string]signature.Key, map[string][]string, error) {
	keys := map[string]signature.Key{}
	for _, name := range Services {
		k := signature.Key{ID: name + "-" + cryptorand.Text()[:8], Secret: make([]byte, 32)}
		if _, err := cryptorand.Read(k.Secret); err != nil {
			return nil, nil, err
		}
		keys[name] = k
	}
	env := map[string][]string{}
	for _, name := range Services {
		var trusted []string
		for _, other := range Services {
			if other != name {
				trusted = append(trusted, signature.FormatKey(keys[other]))
			}
		}
		env[name] = []string{"SIGNING_KEY=" + signature.FormatKey(keys[name]), "TRUSTED_KEYS=" + strings.Join(trusted, ",")}
	}
	return keys, env, nil
}
