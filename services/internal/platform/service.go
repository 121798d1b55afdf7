package platform

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
	"github.com/outboxref/outbox-inbox/services/runtime/httpserve"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
	"github.com/outboxref/outbox-inbox/services/runtime/pgconnect"
	"github.com/outboxref/outbox-inbox/services/runtime/strictjson"
)

// Service describes one example service to Run.
type Service struct {
	// Name is the service name; it is also the inbox consumer name and the
	// Kafka consumer group, shared by all replicas.
	Name string
	// Migrations are the service's own embedded SQL files.
	Migrations fs.FS
	// Topic is the topic the service consumes.
	Topic string
	// Apply applies a batch of messages, each new to the service, in the
	// inbox's transaction, and writes only through it (see pkg/inbox
	// BatchFunc). With INBOX_BATCH_SIZE=1 every batch holds one message.
	// Errors wrapped with inbox.Permanent dead-letter the message at once.
	// It is made from the configuration (DOMAIN_GUARD_DISABLED).
	Apply func(Config) inbox.BatchFunc
	// Envelope reads what a message's payload says about the record that
	// carries it (inbox.Config.Envelope): a record whose Kafka key, topic or
	// type header disagrees is quarantined before Apply sees it.
	Envelope func(*message.Message) (inbox.Envelope, bool)
	// Routes adds the service's HTTP endpoints.
	// Its writes answer through db.Write.
	Routes func(mux *http.ServeMux, db DB, cfg Config)
	// Effects, when set, makes the runners of the service's effects outside
	// the database (pkg/effect), one per kind; the effects table is
	// migrated for them. An Effects without Run runs none of its kind (the
	// effects wait, recorded). Each runner waits for db.Standby
	// (effect.Config.Standby).
	Effects func(db DB, cfg Config, log *slog.Logger) ([]Effects, error)
}

// Effects is a running service's runner of one kind of effect.
type Effects struct {
	Kind  string
	Run   func(context.Context) error
	Stats func() effect.RunnerStats
}

// Stats is what GET /stats returns.
type Stats struct {
	Service  string                        `json:"service"`
	Instance string                        `json:"instance"`
	Inbox    inbox.Stats                   `json:"inbox"`
	Relay    outbox.RelayStats             `json:"relay"`
	Effects  map[string]effect.RunnerStats `json:"effects,omitempty"` // by kind
}

// Run starts the service and blocks until ctx ends. Then every part stops
// at once, each finishing what it started: the HTTP server stops taking
// requests and lets those in flight answer (up to 10s), the router waits for
// the messages in flight to commit, the relay finishes its batch, the inbox's
// Run lets its batch transactions commit. The pool is closed only after all
// of them returned.
//
// It reads top to bottom: what the process may do, its database, what goes
// out (the outbox's relay), what comes in (the inbox behind the Kafka
// consumer), its HTTP surface, and then all of them at once.
func Run(ctx context.Context, cfg Config, svc Service) error {
	log := NewLogger(cfg.LogLevel).With("service", svc.Name, "instance", cfg.Instance)
	if err := checkStart(cfg, log); err != nil {
		return err
	}
	stopTracing, err := setupTracing(ctx, cfg, svc.Name) // tracing.go
	if err != nil {
		return err
	}
	defer stopTracing(context.Background()) //nolint:errcheck // best effort flush

	pool, err := pgconnect.Open(ctx, cfg.DatabaseURL, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables, err := migrateAll(ctx, cfg, svc, pool)
	if err != nil {
		return err
	}
	db, err := newDB(cfg, pool, log) // db.go: DATABASE_STANDBYS
	if err != nil {
		return err
	}
	effects, err := newEffects(cfg, svc, db, log)
	if err != nil {
		return err
	}
	mtr := newMetrics(pool, log)                                                 // metrics.go
	signing, err := newSigning(cfg, svc.Topic, kafkaconf.RedriveTopic(svc.Name)) // signing.go
	if err != nil {
		return err
	}
	signing.warn(log, svc.Topic)

	out, err := newOutgoing(cfg, svc, db, signing, tables.outbox, log)
	if err != nil {
		return err
	}
	defer out.publisher.Close()
	in, err := newIncoming(cfg, svc, db, signing, tables.inbox, mtr, log)
	if err != nil {
		return err
	}
	mtr.register(in.inbox, out.relay, cfg.RelayShards)
	mtr.registerEffects(effects)
	primary := &primaryWatch{log: log} // primary.go: readiness, a line per failover
	mtr.registerDatabase(primary, db.Standby)
	srv, ln, err := newHTTP(cfg, svc, db, in, out, effects, primary, mtr, log)
	if err != nil {
		return err
	}
	con, err := newConsole(cfg, svc, pool, log) // console.go: CONSOLE_ADDR
	if err != nil {
		return err
	}
	return serve(ctx, cfg, svc, pool, in, out, effects, primary, srv, ln, con, log)
}

// checkStart refuses what the process must not do, and says what it will.
func checkStart(cfg Config, log *slog.Logger) error {
	// Its state-changing routes are open to whoever reaches HTTP_ADDR:
	// beyond loopback, only with a credential.
	if err := httpserve.CheckExposure("HTTP_ADDR", cfg.HTTPAddr, cfg.HTTPToken); err != nil {
		return err
	}
	// The control runs' switches turn a guarantee off: only a failpoint
	// build honours them, and a default build refuses to start with one
	// set (controls.go).
	if err := checkControls(cfg); err != nil {
		return err
	}
	if err := failpoint.FromEnv(); err != nil { // a no-op unless built with -tags failpoint
		return fmt.Errorf("failpoints: %w", err)
	}
	if !failpoint.Enabled && os.Getenv("FAILPOINTS") != "" {
		log.Warn("FAILPOINTS is ignored: this binary was built without -tags failpoint, no crash window can fire")
	}
	// Its Kafka login (KAFKA_SASL_*): every Sarama client it makes
	// (kafkaconf.Sarama) logs in as this principal; a half-set login is
	// refused here rather than as a handshake failure later.
	login, err := kafkaconf.CredentialsFromEnv()
	if err != nil {
		return err
	}
	if login.Empty() {
		log.Warn("kafka: no login (KAFKA_SASL_USERNAME unset): a broker that authenticates will refuse this service")
	} else {
		log.Info("kafka: logging in", "principal", login.Principal(), "mechanism", login.Mechanism)
	}
	return nil
}

// tables are how the inbox's and the outbox's tables are partitioned (nil:
// not at all).
type tables struct {
	inbox  *inbox.Partitioning
	outbox *outbox.Partitioning
}

// migrateAll migrates the library's tables and the service's own, and
// converts the inbox and outbox to partitioned tables when configured.
func migrateAll(ctx context.Context, cfg Config, svc Service, pool *pgxpool.Pool) (tables, error) {
	var t tables
	if err := outbox.Migrate(ctx, pool); err != nil {
		return t, fmt.Errorf("migrating outbox: %w", err)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return t, fmt.Errorf("migrating inbox: %w", err)
	}
	if cfg.InboxPartitionInterval > 0 {
		t.inbox = &inbox.Partitioning{Interval: cfg.InboxPartitionInterval}
		if err := inbox.PartitionByIDTime(ctx, pool, *t.inbox, time.Time{}); err != nil {
			return t, fmt.Errorf("INBOX_PARTITION_INTERVAL: %w", err)
		}
	}
	if cfg.OutboxPartitionInterval > 0 {
		t.outbox = &outbox.Partitioning{Interval: cfg.OutboxPartitionInterval}
		if err := outbox.PartitionByTime(ctx, pool, *t.outbox); err != nil {
			return t, fmt.Errorf("OUTBOX_PARTITION_INTERVAL: %w", err)
		}
	}
	if svc.Effects != nil {
		if err := effect.Migrate(ctx, pool); err != nil {
			return t, fmt.Errorf("migrating effects: %w", err)
		}
	}
	if err := migrate.Apply(ctx, pool, svc.Name, svc.Migrations); err != nil {
		return t, fmt.Errorf("migrating %s: %w", svc.Name, err)
	}
	return t, nil
}

// newEffects makes the service's effect runners, if it has effects.
func newEffects(cfg Config, svc Service, db DB, log *slog.Logger) ([]Effects, error) {
	if svc.Effects == nil {
		return nil, nil
	}
	effects, err := svc.Effects(db, cfg, log)
	if err != nil {
		return nil, fmt.Errorf("effects: %w", err)
	}
	for _, e := range effects {
		if e.Run == nil {
			log.Warn("PROVIDER_URL is unset: effects are recorded and wait; none is performed", "kind", e.Kind)
		}
	}
	if cfg.EffectKeysDisabled {
		log.Warn("EFFECT KEYS DISABLED: effects are sent without their idempotency key; a repeated call performs them again")
	}
	return effects, nil
}

// outgoing is what the service sends: the outbox's relay and its publisher.
type outgoing struct {
	publisher message.Publisher
	relay     *outbox.Relay
}

// newOutgoing makes the relay of the service's outbox, publishing to Kafka
// through signing's publisher.
func newOutgoing(cfg Config, svc Service, db DB, signing signing, partitions *outbox.Partitioning, log *slog.Logger) (outgoing, error) {
	publisher, err := newRelayPublisher(cfg, svc.Name, marshaler(), log) // relay.go
	if err != nil {
		return outgoing{}, err
	}
	signed, err := signing.publisher(publisher)
	if err != nil {
		publisher.Close()
		return outgoing{}, err
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: db.Pool, Standby: db.Standby, Publisher: signed, Logger: log,
		IsPermanent: outboxkafka.IsPermanent, // Kafka's refusals through either driver's publisher
		BatchSize:   cfg.RelayBatchSize, PollInterval: cfg.RelayPollInterval, Retention: cfg.RelayRetention,
		KeySequenceRetention: cfg.RelayKeySequenceRetention,
		Shards:               cfg.RelayShards, LeaseTTL: cfg.RelayLeaseTTL, RelayID: cfg.Instance, Parallel: cfg.RelayParallel,
		Partitions: partitions,
	})
	if err != nil {
		publisher.Close()
		return outgoing{}, err
	}
	if cfg.RelayParallel {
		log.Warn("RELAY PARALLEL: every replica's relay publishes at once; a key's messages may reach Kafka out of commit order")
	}
	return outgoing{publisher: signed, relay: relay}, nil
}

// marshaler puts a message's partition key in its Kafka record's key, both
// ways.
func marshaler() kafka.MarshalerUnmarshaler {
	return kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
}

// incoming is what the service receives: the inbox, behind a router
// consuming the service's topic, and the consumer's stall watchdog.
type incoming struct {
	inbox     *inbox.Inbox
	router    *message.Router
	watchdogs []*inboxkafka.Watchdog // a feed's each (consumer.go)
}

// newIncoming makes the inbox and the Kafka consumer that feeds it.
func newIncoming(cfg Config, svc Service, db DB, signing signing, partitions *inbox.Partitioning, mtr *metrics, log *slog.Logger) (incoming, error) {
	onDeadLetter, err := deadLetterPolicy(cfg.InboxOnDeadLetter)
	if err != nil {
		return incoming{}, err
	}
	ibx, err := inbox.New(withControls(cfg, inbox.Config{
		Pool: db.Pool, Standby: db.Standby, Consumer: svc.Name, Logger: log, OnDeadLetter: onDeadLetter,
		MaxAttempts: cfg.InboxMaxAttempts, RetryBackoff: cfg.InboxRetryBackoff, MaxPayloadBytes: cfg.InboxMaxPayloadBytes,
		BatchSize: cfg.InboxBatchSize, BatchWorkers: cfg.InboxBatchWorkers, BatchLinger: cfg.InboxBatchLinger,
		Retention: cfg.InboxRetention, Partitions: partitions,
		CheckID:      inbox.CanonicalUUID,                                                     // pkg/outbox issues UUIDv7s: one spelling per id
		Verify:       signing.verify,                                                          // TRUSTED_KEYS: only what a trusted producer signed
		Envelope:     svc.Envelope,                                                            // and whose record says what its payload says
		Key:          inboxkafka.Key,                                                          // the Kafka record's key, which placed it
		Position:     inboxkafka.Position,                                                     // each row records where Kafka holds its message
		LogStart:     logStart(cfg.KafkaBrokers, svc.Topic, kafkaconf.RedriveTopic(svc.Name)), // and stays while Kafka holds it
		RedriveTopic: kafkaconf.RedriveTopic(svc.Name),                                        // consumer.go: a redrive comes back on a topic of the service's own
		OnOutcome:    mtr.onOutcome(logOutcome(log)),                                          // metrics, then the log
	}))
	if err != nil {
		return incoming{}, err
	}
	if cfg.InboxDisabled {
		log.Warn("INBOX DISABLED: every delivery runs the handler; duplicates reach the domain")
	}
	if cfg.DomainGuardDisabled {
		log.Warn("DOMAIN GUARD DISABLED: an event for an order already decided is applied again")
	}
	if cfg.BadDeploy {
		log.Warn("BAD DEPLOY: every message is dead-lettered, as a broken handler would")
	}
	consumer, err := newConsumer(cfg, svc, ibx, mtr, log) // consumer.go
	if err != nil {
		return incoming{}, err
	}
	apply := ibx.Handler(withBadDeploy(cfg, svc.Apply(cfg)))
	in := incoming{inbox: ibx, router: consumer.router}
	for _, f := range consumer.feeds { // the service's topic, and its redrive topic
		consumer.router.AddConsumerHandler(svc.Name+"."+f.topic, f.topic, f.subscriber, func(msg *message.Message) error {
			mtr.handling(msg) // for commit-to-apply latency
			return apply(msg)
		}).AddMiddleware(f.watchdog.Middleware)
		in.watchdogs = append(in.watchdogs, f.watchdog)
	}
	return in, nil
}

// newHTTP makes the service's HTTP server: health, readiness, stats,
// metrics, and the service's own routes.
func newHTTP(cfg Config, svc Service, db DB, in incoming, out outgoing, effects []Effects, primary *primaryWatch, mtr *metrics, log *slog.Logger) (*http.Server, net.Listener, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n")) //nolint:errcheck
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		st := probePrimary(r.Context(), db.Pool)
		primary.note(st, time.Now())
		switch {
		case st.err != nil:
			http.Error(w, "no primary database answers: "+st.err.Error(), http.StatusServiceUnavailable)
		case !in.router.IsRunning():
			http.Error(w, "consumer not running", http.StatusServiceUnavailable)
		case !in.inbox.Running():
			http.Error(w, "inbox not running", http.StatusServiceUnavailable)
		case cfg.RelayDriver != "textbook" && !out.relay.Running():
			http.Error(w, "relay not running", http.StatusServiceUnavailable)
		default:
			w.Write([]byte("ready\n")) //nolint:errcheck
		}
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		st := Stats{Service: svc.Name, Instance: cfg.Instance, Inbox: in.inbox.Stats(), Relay: out.relay.Stats()}
		for _, e := range effects {
			if e.Stats != nil {
				if st.Effects == nil {
					st.Effects = map[string]effect.RunnerStats{}
				}
				st.Effects[e.Kind] = e.Stats()
			}
		}
		WriteJSON(w, http.StatusOK, st)
	})
	mux.Handle("GET /metrics", mtr.handler())
	if cfg.DebugPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	crashRoute(mux, log) // POST /debug/crash, in a failpoint build only
	svc.Routes(mux, db, cfg)
	// Timeouts, known hosts only, no cross-site writes, JSON bodies only.
	// A credential on every state-changing route when HTTP_TOKEN is set
	// (checked at the start of Run when the server listens beyond loopback).
	srv := httpserve.Server(cfg.HTTPAddr, traceHTTP(mux), httpserve.Options{AllowedHosts: cfg.HTTPAllowedHosts, Token: cfg.HTTPToken})
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %s: %w", cfg.HTTPAddr, err)
	}

	return srv, ln, nil
}

// serve runs every part until ctx ends, then stops them all, each
// finishing what it started.
func serve(ctx context.Context, cfg Config, svc Service, pool *pgxpool.Pool, in incoming, out outgoing, effects []Effects, primary *primaryWatch, srv *http.Server, ln net.Listener, con *consoleServer, log *slog.Logger) error {
	wlog := newWatermillLogger(log)
	g, gctx := errgroup.WithContext(ctx)
	if con != nil {
		g.Go(func() error { return con.run(gctx) })
	}
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		// The router runs until it is closed below; an early return is a failure.
		if err := in.router.Run(context.WithoutCancel(gctx)); err != nil {
			return fmt.Errorf("router: %w", err)
		}
		if gctx.Err() == nil {
			return errors.New("router stopped")
		}
		return nil
	})
	g.Go(func() error { return runRelay(gctx, cfg, out.relay, pool, out.publisher, wlog) })
	g.Go(func() error { return checkRelayRetention(gctx, cfg, log, kafkaconf.ProducedTopics(svc.Name)...) })
	for _, w := range in.watchdogs {
		g.Go(func() error { return watchStalls(gctx, w, log) })
	}
	g.Go(func() error { return primary.run(gctx, pool, time.Second) })
	for _, e := range effects {
		if e.Run != nil {
			g.Go(func() error { return e.Run(gctx) }) // returns once the calls in flight are recorded
		}
	}
	g.Go(func() error {
		// The inbox's batch transactions and its retention sweep. No row is
		// swept before Kafka's retention is known to be covered (a retention
		// it outlasts stops the service); until then deliveries are applied
		// one transaction each.
		if err := checkRetention(gctx, cfg, log, svc.Topic, kafkaconf.RedriveTopic(svc.Name)); err != nil || gctx.Err() != nil {
			return err
		}
		return in.inbox.Run(gctx)
	})
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(shutdownCtx) //nolint:errcheck // best effort; Serve returns either way
		return in.router.Close()  // waits for in-flight handlers to commit
	})
	log.Info("started", "http", ln.Addr().String(), "topic", svc.Topic, "brokers", strings.Join(cfg.KafkaBrokers, ","))
	err := g.Wait()
	log.Info("stopped", "err", err)
	return err
}

// logStart reads the consumed topics' log-start offsets for the inbox
// sweep (inbox.Config.LogStart), with a client of its own each time: the
// sweep runs once a minute.
func logStart(brokers []string, topics ...string) func(context.Context) (inbox.LogStart, error) {
	return func(context.Context) (inbox.LogStart, error) {
		client, err := sarama.NewClient(brokers, kafkaconf.Sarama())
		if err != nil {
			return nil, err
		}
		defer client.Close()
		return inboxkafka.ReadLogStart(client, topics...)
	}
}

// checkRetention returns an error when Kafka keeps a consumed topic
// longer than the inbox keeps its rows (see inboxkafka.CheckRetention), and nil
// once it is covered or ctx ends. It runs beside the consumer, not before
// it, so a broker that is slow to answer (starting, or behind a network
// fault) does not hold up a restart; reading is retried until it answers.
func checkRetention(ctx context.Context, cfg Config, log *slog.Logger, topics ...string) error {
	retention := cmp.Or(cfg.InboxRetention, inbox.DefaultRetention) // what the inbox keeps when the service gives 0
	return askKafka(ctx, cfg, log, "the inbox sweep waits for it", topics, func(admin sarama.ClusterAdmin) error {
		k, err := inboxkafka.CheckRetention(admin, retention, topics...)
		if errors.Is(err, inboxkafka.ErrRetentionTooShort) {
			log.Error("refusing to run: the inbox would forget messages Kafka can still redeliver", "err", err)
			return refused{fmt.Errorf("INBOX_RETENTION: %w", err)}
		}
		if err == nil {
			horizon, _, _ := k.Horizon()
			log.Info("inbox retention covers Kafka's", "inbox_retention", retention.String(),
				"kafka_horizon", horizon.String(), "offsets_retention", k.OffsetsRetention.String())
		}
		return err
	})
}

// checkRelayRetention returns an error when Kafka keeps a topic the relay
// publishes to longer than the relay keeps its published rows (see
// outboxkafka.CheckRetention): what Kafka lost could then not be sent
// again. Like checkRetention, it runs beside the relay until Kafka answers.
func checkRelayRetention(ctx context.Context, cfg Config, log *slog.Logger, topics ...string) error {
	retention := cmp.Or(cfg.RelayRetention, outbox.DefaultRetention)
	return askKafka(ctx, cfg, log, "nothing waits for it", topics, func(admin sarama.ClusterAdmin) error {
		horizon, forever, err := outboxkafka.CheckRetention(admin, retention, topics...)
		switch {
		case errors.Is(err, outboxkafka.ErrRetentionTooShort):
			log.Error("refusing to run: the relay would delete rows whose records Kafka can still lose", "err", err)
			return refused{fmt.Errorf("RELAY_RETENTION: %w", err)}
		case err == nil && forever:
			log.Info("a produced topic keeps records forever: the outbox can send again what Kafka loses only within its retention",
				"relay_retention", retention.String())
		case err == nil:
			log.Info("relay retention covers Kafka's", "relay_retention", retention.String(), "kafka_horizon", horizon.String())
		}
		return err
	})
}

// refused is a check's refusal to run, as opposed to Kafka not answering.
type refused struct{ error }

// askKafka runs check with an admin client of its own until it returns nil
// or a refusal (returned unwrapped), retrying anything else with a backoff
// and logging why; it returns nil once ctx ends.
func askKafka(ctx context.Context, cfg Config, log *slog.Logger, meanwhile string, topics []string, check func(sarama.ClusterAdmin) error) error {
	wait := time.Second
	for {
		err := func() error {
			admin, err := sarama.NewClusterAdmin(cfg.KafkaBrokers, kafkaconf.Sarama())
			if err != nil {
				return err
			}
			defer admin.Close()
			return check(admin)
		}()
		var r refused
		switch {
		case errors.As(err, &r):
			return r.error
		case err == nil:
			return nil
		}
		log.Warn("reading the topics' retention from Kafka; "+meanwhile, "topics", strings.Join(topics, ","), "err", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// NewLogger returns a text logger on stderr at level ("debug", "info", ...).
func NewLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// logOutcome logs the deliveries worth a line: everything but a plain apply.
func logOutcome(log *slog.Logger) func(inbox.Event) {
	return func(e inbox.Event) {
		switch e.Outcome {
		case inbox.Applied:
			log.Debug("message applied", "message_id", e.MessageID, "took", e.Duration)
		case inbox.Duplicate:
			log.Info("duplicate delivery suppressed", "message_id", e.MessageID)
		case inbox.Retried:
			log.Warn("handler failed; retrying", "message_id", e.MessageID, "attempt", e.Attempt, "reason", e.Reason)
		default:
			log.Error("message not applied", "outcome", e.Outcome, "message_id", e.MessageID, "reason", e.Reason)
		}
	}
}

// WriteJSON writes v as a JSON response.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}

// WriteError writes {"error": msg}.
func WriteError(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, map[string]string{"error": msg})
}

// WriteFailure answers a request the service could not serve for err: 503
// with Retry-After when the database was out of reach (restarting, a
// network fault, no connection to be had), so a client knows to try again
// shortly and a monitor does not count a bug; 500 for anything else.
func WriteFailure(w http.ResponseWriter, err error) {
	if DatabaseUnavailable(err) {
		w.Header().Set("Retry-After", "1")
		WriteError(w, http.StatusServiceUnavailable, "the database is unavailable, try again: "+err.Error())
		return
	}
	WriteError(w, http.StatusInternalServerError, err.Error())
}

// DatabaseUnavailable reports whether err says the database could not be
// reached or dropped the connection, rather than refused the statement: a
// connection that could not be made, the server shutting down or starting
// up (57P01-57P03), too many connections (53300), a connection exception
// (class 08, but for 08P01, a protocol violation: a client's bug), or the
// connection failing under the statement. A deadline or a cancellation is
// not an outage: a statement stuck behind a lock, or a pool whose
// connections leaked, times out against a database that is up, and that
// is a bug to see, not a 503.
func DatabaseUnavailable(err error) bool {
	if errors.As(err, new(standbyError)) {
		return true // committed, not confirmed held: the client asks again
	}
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") && pgErr.Code != "08P01" || pgErr.Code == "53300" ||
			pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03" ||
			pgErr.Code == "25006" // read_only_sql_transaction: a connection to a demoted primary, after a failover
	}
	var connErr *pgconn.ConnectError
	var opErr *net.OpError
	return errors.As(err, &connErr) || errors.As(err, &opErr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE)
}

// deadLetterPolicy reads INBOX_ON_DEAD_LETTER.
func deadLetterPolicy(s string) (inbox.DeadLetterPolicy, error) {
	switch s {
	case "skip", "":
		return inbox.SkipKey, nil
	case "hold":
		return inbox.HoldKey, nil
	}
	return 0, fmt.Errorf("INBOX_ON_DEAD_LETTER=%q: want skip or hold", s)
}

// ReadJSON reads r's body, at most limit bytes, into v with the strict
// decoder (services/runtime/strictjson): a key twice or in another case, unknown or
// missing fields, null, data after the value are refused, with the reason.
// An empty body is io.EOF, for routes where the body is optional.
func ReadJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return fmt.Errorf("the body is over %d bytes", limit)
		}
		return fmt.Errorf("reading the body: %w", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return io.EOF
	}
	return strictjson.Decode(body, v)
}
