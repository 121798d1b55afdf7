// Package platform is the wiring both example services share: configuration
// from the environment, the Postgres pool, the Kafka publisher and
// subscriber, the outbox relay, the inbox-wrapped consumer, and the HTTP
// server with health endpoints. It uses only the public API of pkg/outbox and
// pkg/inbox, as any service importing them would.
package platform

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// Config is read from the environment; each field's env tag names its
// variable and its default tag gives the value used when it is unset. A
// setting pkg/inbox or pkg/outbox has a default for is 0 by default here,
// and 0 means the library's default (inbox.DefaultMaxAttempts, …): the
// defaults are written once, in the library.
type Config struct {
	DatabaseURL string `env:"DATABASE_URL" required:"true"`
	// DatabaseStandbys, on a Postgres that replicates asynchronously, is
	// how many of the primary's streaming standbys must hold a transaction
	// before anything that rests on it leaves the service: an answer to a
	// client, an event the relay publishes, a Kafka offset the consumer
	// commits, a call the effect runner makes (pkg/standby; docs/failover.md).
	// 0: nothing waits (one node, or synchronous replication).
	DatabaseStandbys int `env:"DATABASE_STANDBYS" default:"0"`
	// DatabaseStandbySlots, when set, are the replication slots of the
	// standbys a failover may promote; empty: every streaming standby's.
	DatabaseStandbySlots []string `env:"DATABASE_STANDBY_SLOTS"`
	KafkaBrokers         []string `env:"KAFKA_BROKERS" required:"true"`
	HTTPAddr             string   `env:"HTTP_ADDR" default:"127.0.0.1:8080"`
	// HTTPAllowedHosts are the host names (or name:port) the HTTP server
	// answers besides loopback and HTTP_ADDR's host; any other Host header
	// is refused with 421 (services/runtime/httpserve: DNS rebinding).
	HTTPAllowedHosts []string `env:"HTTP_ALLOWED_HOSTS"`
	// HTTPToken, when set, is required of every state-changing request
	// ("Authorization: Bearer <token>", 401 otherwise). A service whose
	// HTTP_ADDR is beyond loopback refuses to start without it.
	HTTPToken string `env:"HTTP_TOKEN"`
	// ConsoleAddr, when set, serves the service's web console (pkg/console:
	// failure groups, bulk retries and drops, the history) on this address.
	// Beyond loopback it needs ConsoleUsers.
	ConsoleAddr string `env:"CONSOLE_ADDR"`
	// ConsoleUsers are the console's logins, "name:role:secret" comma
	// separated (role viewer or operator). None: loopback clients only.
	ConsoleUsers string `env:"CONSOLE_USERS"`
	// ConsoleKey signs the console's forms: replicas behind one address
	// need the same one, and with it a restart keeps open forms good (32
	// bytes or more). Unset: random per process.
	ConsoleKey string `env:"CONSOLE_KEY"`
	Instance   string `env:"INSTANCE"` // replica name in logs; defaults to host-pid
	LogLevel   string `env:"LOG_LEVEL" default:"info"`
	// DebugPprof serves Go's profiler at /debug/pprof/ on HTTP_ADDR.
	DebugPprof bool `env:"DEBUG_PPROF" default:"false"`

	// How often Sarama commits marked offsets. A crash redelivers at most
	// this much work; the inbox makes the redeliveries harmless.
	KafkaCommitInterval time.Duration `env:"KAFKA_COMMIT_INTERVAL" default:"1s"`
	// Consumer-group session timeout: how long a killed replica's partitions
	// wait before they move to a live one.
	KafkaSessionTimeout time.Duration `env:"KAFKA_SESSION_TIMEOUT" default:"10s"`
	// How long the group coordinator waits for every member to rejoin during
	// a rebalance. A member that died mid-rebalance holds the whole group up
	// for this long, so chaos runs, which kill members every second, lower it.
	KafkaRebalanceTimeout time.Duration `env:"KAFKA_REBALANCE_TIMEOUT" default:"60s"`
	// How long a partition this replica holds may have records waiting and
	// none reaching the handler before the service exits for a new session
	// (pkg/inbox/inboxkafka Watchdog). 0: inboxkafka.DefaultStallTimeout.
	KafkaStallTimeout time.Duration `env:"KAFKA_STALL_TIMEOUT" default:"0s"`

	InboxMaxAttempts  int           `env:"INBOX_MAX_ATTEMPTS" default:"0"`   // 0: inbox.DefaultMaxAttempts
	InboxRetryBackoff time.Duration `env:"INBOX_RETRY_BACKOFF" default:"0s"` // 0: inbox.DefaultRetryBackoff
	// Deliveries that arrive together, up to this many, are applied by one
	// call of the service's Apply in one transaction (pkg/inbox
	// Config.BatchSize). 1: a transaction per message, the textbook shape.
	InboxBatchSize    int `env:"INBOX_BATCH_SIZE" default:"64"`
	InboxBatchWorkers int `env:"INBOX_BATCH_WORKERS" default:"1"`
	// How long a busy consumer's batch waits for more deliveries (pkg/inbox
	// Config.BatchLinger). 0: never.
	InboxBatchLinger time.Duration `env:"INBOX_BATCH_LINGER" default:"1ms"`
	// Concurrent API writes (payments) are committed together, up to this
	// many per transaction, this many transactions at once, a busy batch
	// waiting up to the linger for the last one's clients (group.go).
	// 1: a transaction per request, the textbook shape.
	APIBatchSize    int           `env:"API_BATCH_SIZE" default:"64"`
	APIBatchWorkers int           `env:"API_BATCH_WORKERS" default:"1"`
	APIBatchLinger  time.Duration `env:"API_BATCH_LINGER" default:"0s"`
	// Larger payloads are quarantined unread. 0: inbox.DefaultMaxPayloadBytes.
	InboxMaxPayloadBytes int `env:"INBOX_MAX_PAYLOAD_BYTES" default:"0"`
	// How long an inbox row is kept (pkg/inbox Config.Retention). At start
	// the service reads its topic's retention from Kafka and refuses to run
	// with a shorter one (inboxkafka.CheckRetention). 0: inbox.DefaultRetention
	// (15 days), which covers Kafka's defaults.
	InboxRetention time.Duration `env:"INBOX_RETENTION" default:"0s"`
	// When set, inbox_messages is partitioned by the time in each message's
	// id, one partition per this span (pkg/inbox Config.Partitions): at
	// start the service converts the table in place if it is not
	// (inbox.PartitionByIDTime), and retention drops whole partitions.
	// Every replica must use the same value. 0: one table, rows deleted.
	InboxPartitionInterval time.Duration `env:"INBOX_PARTITION_INTERVAL" default:"0s"`
	// What a dead letter does to its key's later messages (pkg/inbox
	// Config.OnDeadLetter): "skip" applies them (inbox.SkipKey), "hold"
	// parks them until the dead letter is redriven or discarded, then
	// applies them in order (inbox.HoldKey).
	InboxOnDeadLetter string `env:"INBOX_ON_DEAD_LETTER" default:"skip"`
	// InboxDisabled switches deduplication off. Only the chaos harness's
	// control run sets it, to prove the harness catches double-applies.
	InboxDisabled bool `env:"INBOX_DISABLED" default:"false"`
	// DomainGuardDisabled switches off the services' second layer, the
	// check that an order is decided (inventory) and answered (orders) at
	// most once whatever the message id. Only the chaos harness's second
	// control run sets it, with the inbox off too, to prove that duplicates
	// reaching the domain would be applied twice.
	DomainGuardDisabled bool `env:"DOMAIN_GUARD_DISABLED" default:"false"`
	// BadDeploy makes the consumer's handler refuse every message for good,
	// as a bad deploy would: each is dead-lettered. Only the console's
	// browser test sets it (a failpoint build's), to make a failure group
	// of a thousand messages; restarted without it, the service is "fixed".
	BadDeploy bool `env:"BAD_DEPLOY" default:"false"`

	// RelayDriver picks the relay: "batch" (pkg/outbox's Relay with the
	// batching outboxkafka.Publisher), "watermill" (pkg/outbox's Relay with
	// watermill-kafka's one-at-a-time Publisher) or "textbook" (the
	// benchmark's baseline, services/internal/platform/textbook).
	RelayDriver       string        `env:"RELAY_DRIVER" default:"batch"`
	RelayBatchSize    int           `env:"RELAY_BATCH_SIZE" default:"0"`     // 0: outbox.DefaultBatchSize
	RelayPollInterval time.Duration `env:"RELAY_POLL_INTERVAL" default:"0s"` // 0: outbox.DefaultPollInterval
	RelayRetention    time.Duration `env:"RELAY_RETENTION" default:"0s"`     // 0: outbox.DefaultRetention
	// How long a key's counter (its events' numbers, outbox_key_seq) is
	// kept after its last event; keep it above every consumer's
	// INBOX_RETENTION. 0: outbox.DefaultKeySequenceRetention (30 days).
	RelayKeySequenceRetention time.Duration `env:"RELAY_KEY_SEQUENCE_RETENTION" default:"0s"`
	// When set, outbox_messages is partitioned into blocks of ids, one
	// partition per this span (pkg/outbox RelayConfig.Partitions): at start
	// the service converts the table in place if it is not
	// (outbox.PartitionByTime), and retention drops whole partitions. 0: one
	// table, rows deleted.
	OutboxPartitionInterval time.Duration `env:"OUTBOX_PARTITION_INTERVAL" default:"0s"`
	// RelayShards > 1 lets the replicas' relays share the outbox in shards
	// (pkg/outbox "Sharded relays"), each relay named by Instance; every
	// replica must use the same count.
	RelayShards   int           `env:"RELAY_SHARDS" default:"0"`     // 0: one relay leads
	RelayLeaseTTL time.Duration `env:"RELAY_LEASE_TTL" default:"0s"` // 0: outbox.DefaultLeaseTTL
	// RelayParallel lets every replica's relay publish at once, each
	// claiming rows with SKIP LOCKED (pkg/outbox RelayConfig.Parallel), and
	// gives up each key's order. Only the chaos harness's ordering control
	// run sets it, to prove the harness sees keys reordered; it excludes
	// RELAY_SHARDS > 1.
	RelayParallel bool `env:"RELAY_PARALLEL" default:"false"`

	// Effects outside the database (pkg/effect): orders captures payments
	// at PROVIDER_URL (unset: captures are recorded and wait, none is made).
	ProviderURL      string        `env:"PROVIDER_URL"`
	ProviderToken    string        `env:"PROVIDER_TOKEN"`                  // the provider's HTTP_TOKEN, sent with each capture
	EffectWorkers    int           `env:"EFFECT_WORKERS" default:"0"`      // 0: effect.DefaultWorkers
	EffectLease      time.Duration `env:"EFFECT_LEASE" default:"0s"`       // 0: effect.DefaultLease
	EffectMinBackoff time.Duration `env:"EFFECT_MIN_BACKOFF" default:"0s"` // 0: effect.DefaultMinBackoff
	EffectMaxBackoff time.Duration `env:"EFFECT_MAX_BACKOFF" default:"0s"` // 0: effect.DefaultMaxBackoff
	// EffectKeysDisabled sends effects without their idempotency key. Only
	// the chaos harness's effect control run sets it, to prove that a crash
	// after the provider performed a capture and before it was recorded
	// captures twice without the key.
	EffectKeysDisabled bool `env:"EFFECT_KEYS_DISABLED" default:"false"`

	// Signed events (pkg/signature, signing.go). SIGNING_KEY is this
	// service's key, "id:secret" with a secret of 32 bytes or more in
	// base64url: its relay signs every message it publishes. TRUSTED_KEYS
	// (comma-separated, same form) are the keys of the producers whose
	// events it consumes: its inbox quarantines a message signed by none of
	// them (nor by its own key: a redrive) as invalid, so a record written
	// by anyone else who can write to the topic is never applied. Two keys
	// of one producer may be trusted at once, while it rotates. Unset:
	// nothing is signed, nothing verified.
	SigningKey  string   `env:"SIGNING_KEY"`
	TrustedKeys []string `env:"TRUSTED_KEYS"`

	// Tracing (tracing.go): "otlp" exports OpenTelemetry spans, "off"
	// records none; unset means otlp when OTEL_EXPORTER_OTLP_ENDPOINT is set.
	Tracing      string `env:"TRACING"`
	OTLPEndpoint string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"` // read by the exporter; default http://localhost:4318
}

// EnvVars lists every variable LoadConfig reads, plus the Kafka login
// (KAFKA_SASL_*, read by kafkaconf.CredentialsFromEnv at start) and the
// failpoint variables read by pkg/failpoint.
func EnvVars() []string {
	var names []string
	t := reflect.TypeOf(Config{})
	for i := range t.NumField() {
		names = append(names, t.Field(i).Tag.Get("env"))
	}
	names = append(names, kafkaconf.EnvMechanism, kafkaconf.EnvUsername, kafkaconf.EnvPassword)
	return append(names, "FAILPOINTS", "FAILPOINT_SEED", "FAILPOINT_LOG", "FAILPOINT_GRACE", "FAILPOINT_TRACE")
}

// LoadConfig reads Config from the environment, with httpAddr as the default
// HTTP_ADDR of the calling service.
func LoadConfig(httpAddr string) (Config, error) {
	var cfg Config
	v := reflect.ValueOf(&cfg).Elem()
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("env")
		raw, set := os.LookupEnv(name)
		raw = strings.TrimSpace(raw)
		if !set || raw == "" {
			if f.Tag.Get("required") == "true" {
				return cfg, fmt.Errorf("%s is required", name)
			}
			raw = f.Tag.Get("default")
			if name == "HTTP_ADDR" {
				raw = httpAddr
			}
		}
		if err := setField(v.Field(i), raw); err != nil {
			return cfg, fmt.Errorf("%s=%q: %w", name, raw, err)
		}
	}
	if cfg.Instance == "" {
		host, _ := os.Hostname()
		cfg.Instance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return cfg, nil
}

func setField(f reflect.Value, raw string) error {
	switch f.Interface().(type) {
	case string:
		f.SetString(raw)
	case []string:
		var items []string
		for _, s := range strings.Split(raw, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		f.Set(reflect.ValueOf(items))
	case int:
		if raw == "" {
			return nil
		}
		n, err := strconv.Atoi(raw)
		if err != nil {
			return err
		}
		f.SetInt(int64(n))
	case bool:
		if raw == "" {
			return nil
		}
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return err
		}
		f.SetBool(b)
	case time.Duration:
		if raw == "" {
			return nil
		}
		d, err := time.ParseDuration(raw)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
	default:
		return fmt.Errorf("unsupported field type %s", f.Type())
	}
	return nil
}
