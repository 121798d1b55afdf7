package outbox

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxref/outbox-inbox/pkg/internal/check"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// maxShards bounds RelayConfig.Shards: a shard is a lease row, and a relay
// renews its leases in one statement.
const maxShards = 1024

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Pool is the database that holds outbox_messages. Required.
	Pool *pgxpool.Pool
	// Publisher receives the rows, for example a watermill-kafka Publisher
	// built with kafka.NewWithPartitioningMarshaler(outbox.PartitionKey).
	// Publish must return only after the broker acknowledged every message.
	// Required.
	Publisher message.Publisher

	// BatchSize is how many rows one transaction claims and publishes.
	// Defaults to DefaultBatchSize.
	BatchSize int
	// PollInterval is how often the relay looks for rows when nothing woke
	// it. A commit's notification wakes it within milliseconds; the poll
	// covers a lost listener connection and the rare row whose producer did
	// not notify because another one was notifying at that moment (see
	// PublishTx) and that committed after the relay's follow-up polls.
	// Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// Parallel lets several relay replicas publish at the same moment
	// (each claims rows with SKIP LOCKED). It raises throughput but gives up
	// per-key order across replicas. Defaults to false: replicas take turns
	// through an advisory lock, and a standby takes over within PollInterval
	// when the active one dies.
	Parallel bool
	// Shards, when over 1, divides the outbox into that many shards by a
	// hash of the partition key and lets relay replicas publish different
	// shards at once: each shard has one owner at a time, through a lease
	// with a fencing token, and a key's messages reach the broker in commit
	// order across handovers (doc.go, "Sharded relays"). Every replica of
	// one outbox must use the same count; it can be changed only while no
	// relay runs. 0 or 1: one relay leads the whole outbox at a time.
	Shards int
	// LeaseTTL is how long a shard stays with a relay that stopped renewing
	// its lease (it renews every LeaseTTL/3): a dead relay's shards move
	// after it. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// RelayID names this relay in the lease table. Defaults to a random id;
	// give each replica its own.
	RelayID string
	// ErrorBackoff is how long the relay waits after a failed batch before it
	// tries again; it doubles with each failure in a row, up to
	// MaxErrorBackoff, and starts over after a batch succeeds. Defaults to
	// DefaultErrorBackoff.
	ErrorBackoff time.Duration
	// MaxErrorBackoff caps the wait between failed batches. Defaults to
	// DefaultMaxErrorBackoff (or ErrorBackoff, if that is longer).
	MaxErrorBackoff time.Duration
	// MaxMessageBytes is the largest message, measured by RecordBytes, the
	// relay sends; a larger row is parked (see Parked) without a send. Keep
	// it equal to the publisher's limit (Sarama's Producer.MaxMessageBytes)
	// and to the Writer's. Defaults to DefaultMaxMessageBytes.
	MaxMessageBytes int
	// IsPermanent tells a refusal of a message itself (the broker will never
	// take it) from a transient failure, for the errors Publisher returns.
	// When a batch fails permanently, the relay publishes its rows one by
	// one and parks those refused. Defaults to IsPermanent.
	IsPermanent func(error) bool
	// BatchTimeout bounds one claim-publish-mark transaction. A batch in
	// flight when Run's context ends is finished, within this bound, so a
	// graceful shutdown does not republish it; the Publisher's call itself
	// is not bounded by it (outboxkafka.Publisher waits out a Kafka outage,
	// and Run with it: a process stopped meanwhile loses nothing, its rows
	// go to the next relay). It is also the fence: a
	// relay whose transaction sits idle longer than BatchTimeout + 1s (a
	// paused process, a publish that never returns) has its session ended by
	// Postgres, so a standby takes the lead and the rows. Defaults to
	// DefaultBatchTimeout.
	BatchTimeout time.Duration

	// Retention is how long published rows are kept before the retention job
	// deletes them: what Kafka loses can be sent again (outboxadmin.Republish)
	// while its rows are kept. Keep it at least as long as Kafka keeps the
	// topics' records (outboxkafka.CheckRetention), and at most as long as
	// the consumers keep their inbox rows (inbox.Config.Retention), or a row
	// sent again after a consumer forgot it is applied again. Defaults to
	// DefaultRetention, which covers Kafka's default topic configs.
	Retention time.Duration
	// RetentionInterval is how often the retention job runs. Defaults to
	// DefaultRetentionInterval.
	RetentionInterval time.Duration
	// RetentionBatch is how many rows one DELETE removes. Defaults to
	// DefaultRetentionBatch.
	RetentionBatch int
	// KeySequenceRetention is how long a key's counter (SequenceMetadata)
	// is kept after its last message was written. A key written again
	// after that starts again at 1: keep it above every consumer's memory
	// of a key (inbox.Config.Retention, 15 days by default), or a consumer
	// that still remembers the key's last number takes the 1 for a rewind.
	// Defaults to DefaultKeySequenceRetention.
	KeySequenceRetention time.Duration

	// Partitions, when set, says outbox_messages is partitioned into blocks
	// of ids, one per interval of time (PartitionByTime converts the
	// table), and the retention job drops whole partitions whose rows are
	// all published and past Retention, instead of deleting rows. The relay
	// refuses to run on an unpartitioned table with it.
	Partitions *Partitioning

	// Standby, on a Postgres that replicates asynchronously, holds each
	// batch back until the standbys a failover would promote hold its rows
	// (see package standby): no event leaves whose cause a failover can
	// take back (a ghost). Nil: batches leave once committed (one node, or
	// synchronous replication).
	Standby *standby.Gate

	// Logger receives what goes wrong (and, at Info, what an operator
	// wants to know, like a shard moving). Defaults to discarding it.
	Logger *slog.Logger
	// log is Logger as Watermill's adapter, the form the code logs through.
	log watermill.LoggerAdapter
}

// The defaults of RelayConfig's zero fields.
const (
	DefaultBatchSize            = 500
	DefaultPollInterval         = 250 * time.Millisecond
	DefaultErrorBackoff         = 200 * time.Millisecond
	DefaultMaxErrorBackoff      = 10 * time.Second
	DefaultBatchTimeout         = 30 * time.Second
	DefaultRetention            = 15 * 24 * time.Hour // Kafka's default retention.ms and segment.ms (7 days each) and a day; inbox.DefaultRetention's
	DefaultRetentionInterval    = time.Minute
	DefaultRetentionBatch       = 5000
	DefaultKeySequenceRetention = 30 * 24 * time.Hour
	DefaultLeaseTTL             = 10 * time.Second
)

// setDefaults fills the zero fields. Negative values are left for Validate
// to refuse.
func (c *RelayConfig) setDefaults() {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.ErrorBackoff = cmp.Or(c.ErrorBackoff, DefaultErrorBackoff)
	c.MaxErrorBackoff = cmp.Or(c.MaxErrorBackoff, max(DefaultMaxErrorBackoff, c.ErrorBackoff))
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, DefaultBatchTimeout)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.RetentionInterval = cmp.Or(c.RetentionInterval, DefaultRetentionInterval)
	c.RetentionBatch = cmp.Or(c.RetentionBatch, DefaultRetentionBatch)
	c.KeySequenceRetention = cmp.Or(c.KeySequenceRetention, DefaultKeySequenceRetention)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	if c.RelayID == "" {
		c.RelayID = uuid.NewString()
	}
	if c.IsPermanent == nil {
		c.IsPermanent = IsPermanent
	}
	if c.Partitions != nil {
		p := c.Partitions.withDefaults() // the caller's value stays as it was
		c.Partitions = &p
	}
	c.log = watermill.NopLogger{}
	if c.Logger != nil {
		c.log = watermill.NewSlogLogger(c.Logger)
	}
}

// Validate reports the first invalid field. NewRelay calls it after filling
// in the defaults of zero fields, so zero is valid wherever a default exists.
func (c RelayConfig) Validate() error {
	f := check.Config("outbox: RelayConfig")
	f.Required("Pool", c.Pool != nil)
	f.Required("Publisher", c.Publisher != nil)
	check.NotNegative(f, "BatchSize", c.BatchSize)
	check.NotNegative(f, "PollInterval", c.PollInterval)
	check.AtLeast(f, "PollInterval", c.PollInterval, time.Millisecond)
	check.NotNegative(f, "Retention", c.Retention)
	check.NotNegative(f, "KeySequenceRetention", c.KeySequenceRetention)
	// Negative values below slip past setDefaults: a negative
	// RetentionInterval panics in time.NewTicker inside Run, a negative
	// BatchTimeout fails every batch, a negative RetentionBatch every DELETE.
	check.NotNegative(f, "ErrorBackoff", c.ErrorBackoff)
	f.That(c.MaxErrorBackoff == 0 || c.MaxErrorBackoff >= c.ErrorBackoff, "MaxErrorBackoff must not be below RelayConfig.ErrorBackoff")
	check.NotNegative(f, "MaxMessageBytes", c.MaxMessageBytes)
	check.NotNegative(f, "BatchTimeout", c.BatchTimeout)
	check.NotNegative(f, "RetentionInterval", c.RetentionInterval)
	check.NotNegative(f, "RetentionBatch", c.RetentionBatch)
	f.That(c.Shards >= 0 && c.Shards <= maxShards, "Shards must be between 0 and %d", maxShards)
	f.That(c.Shards <= 1 || !c.Parallel, "Shards and RelayConfig.Parallel exclude each other: shards keep each key's order, Parallel gives it up")
	check.NotNegative(f, "LeaseTTL", c.LeaseTTL)
	check.AtLeast(f, "LeaseTTL", c.LeaseTTL, 30*time.Millisecond)
	if c.Partitions != nil {
		f.Also(c.Partitions.withDefaults().validate())
	}
	return f.Err()
}
