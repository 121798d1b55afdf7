package inbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/internal/check"
	"github.com/outboxref/outbox-inbox/pkg/internal/pgtable"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// Config configures an Inbox.
type Config struct {
	// Pool is the database that holds the inbox tables and the handler's
	// domain tables: they must share one transaction. Required.
	Pool *pgxpool.Pool
	// Consumer names the deduplication scope: a message is applied once per
	// consumer name. Give each logical consumer (not each replica) its own
	// name. Required.
	Consumer string

	// MessageID returns the id a message is deduplicated by. Defaults to
	// FromUUID (the Watermill message UUID, which watermill-kafka carries in a
	// header). An empty id, one over 1 KiB or not valid UTF-8 text (a key of
	// the inbox's indexes), or an error quarantines the message.
	MessageID func(*message.Message) (string, error)
	// CheckID, when set, refuses an id that is not in the format your
	// producers issue (CanonicalUUID for ids from pkg/outbox): the message is
	// quarantined as invalid, with its id and the reason, before the inbox
	// looks it up. Without it an id in another spelling (upper case, braces,
	// a urn: prefix) is a new key to the inbox, and a copy of an applied
	// message sent under it is applied again unless the domain refuses it.
	CheckID func(id string) error
	// Verify, when set, authenticates each message before the inbox looks
	// its id up: a message it returns an error for is quarantined as
	// invalid, with the error as its reason, and never reaches the inbox row
	// or the handler. With package signature: inboxkafka.Verify(verifier)
	// checks each record's signature against the keys the consumer trusts
	// for its topic, so a record written by anyone else who can write to
	// the topic (a fresh id the inbox has never seen) is refused.
	Verify func(*message.Message) error
	// Envelope, when set, reads what a message's payload says about the
	// record that carries it (the entity it concerns, its type, the topics
	// that type travels on, its id; see Envelope): a message whose record
	// disagrees (another partition key, topic, type header or id) is
	// quarantined as invalid with the disagreement as its reason, after
	// Verify and the payload's size limit and before the inbox looks its
	// id up. ok false (a payload the
	// handler will refuse itself) skips the comparison.
	Envelope func(msg *message.Message) (env Envelope, ok bool)
	// TypeHeader is the metadata entry a record's type header is read
	// from, for Envelope's Type. Defaults to outbox.TypeMetadata.
	TypeHeader string

	// MaxAttempts is how many times a failing handler runs before its message
	// is dead-lettered. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// RetryBackoff is the wait after the first failed attempt; it doubles after
	// each further one, up to MaxRetryBackoff. Defaults to DefaultRetryBackoff.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the wait between attempts. Defaults to
	// DefaultMaxRetryBackoff.
	MaxRetryBackoff time.Duration
	// MaxPayloadBytes is the largest payload handed to the handler; a larger
	// one is quarantined unread. Defaults to DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// DeadLetterTopic is the topic dead letters are published to, through the
	// outbox, in the transaction that records them. Defaults to Consumer+".dlq".
	DeadLetterTopic string
	// RedriveTopic, when set, is where a redrive (inboxadmin.Admin.Retry, a bulk
	// retry) writes this consumer's dead letters back: a topic of the
	// consumer's own, which its Kafka principal may write and read, instead
	// of the producer's topic the message came from, which a consumer
	// should not be allowed to write. Subscribe the same handler to it, in
	// a consumer group of its own. A delivery read from it is taken as from
	// the topic it came from (RedriveTopicMetadata, which the redrive sets)
	// for everything but its Kafka position: its held key, its continuity,
	// its envelope, its quarantine row. Verify sees the redrive topic: the
	// copy goes out through the consumer's own relay, so trust the key that
	// relay signs with for RedriveTopic. Run records it (inbox_consumers),
	// where a redrive from any process reads it. Empty: a redrive writes to
	// the topic the message came from.
	RedriveTopic string

	// Retention is how long a finished message's inbox row is kept; the sweep
	// deletes older rows. A message redelivered after its row was swept would
	// be applied again, so Retention must cover RedeliveryHorizon, and how
	// long Kafka can hand a message out again (inboxkafka.CheckRetention reads
	// that from the cluster: with Kafka's default topic configs, up to 14 days
	// and 5 minutes). Defaults to DefaultRetention.
	Retention time.Duration
	// RedeliveryHorizon is the longest time after a first delivery that the
	// same message can arrive again: the topic's retention, offset replays,
	// a relay that republishes a batch. Defaults to DefaultRedeliveryHorizon.
	RedeliveryHorizon time.Duration
	// LogStart, when set, makes the sweep keep every row whose message
	// Kafka could still hand out: a row read from Kafka is deleted only past
	// Retention and below its partition's log-start offset, that is once
	// Kafka has deleted the record and every copy of it this consumer saw,
	// so no consumer group, whatever its offsets, can read it again. It
	// returns the first offset Kafka holds per topic and partition
	// (inboxkafka.ReadLogStart reads it with a Sarama client); when it
	// fails, the sweep deletes nothing. By age alone go the rows without an
	// offset (Position unset or not reporting one, or rows written before
	// migration 003), those whose copies came on several partitions, and
	// those of a topic LogStart does not report. It needs Position.
	LogStart func(context.Context) (LogStart, error)
	// Position reports where a delivered message sits in its log: partition
	// and offset (inboxkafka.Position reads them from a watermill-kafka
	// delivery). The inbox row records them, for LogStart.
	Position func(*message.Message) (part int32, offset int64, ok bool)
	// RetentionBatch is how many rows one sweep statement deletes.
	// Defaults to DefaultRetentionBatch.
	RetentionBatch int
	// RetentionInterval is how often Inbox.Run sweeps. Defaults to
	// DefaultRetentionInterval.
	RetentionInterval time.Duration

	// Partitions, when set, says inbox_messages is partitioned by the time
	// in each message's id (PartitionByIDTime converts it) and how: each
	// row is written with its id's time (Partitioning.Time; an id without
	// one is quarantined as invalid), and Sweep retires whole partitions
	// instead of deleting rows. Run refuses to start when the table's shape
	// and this field disagree.
	Partitions *Partitioning

	// BatchSize is how many deliveries that arrive together may share one
	// transaction (see batch.go): behind Handler, one call of the BatchFunc
	// for them all, so they share statements as well as the commit; behind
	// Middleware, a savepoint each, so they share the commit (one WAL flush).
	// 1 gives every delivery a transaction of its own. Batches run only while
	// Inbox.Run runs. Defaults to 1.
	BatchSize int
	// BatchLinger is how long a busy consumer's batch may wait for more
	// deliveries once it has taken those already waiting. A consumer
	// delivers one message per partition at a time, so without it the
	// partitions split into two halves that take turns: one half's next
	// messages arrive while the other half's batch commits. The batch waits
	// only for as many deliveries as were in flight during the last one, and
	// only after a batch of more than one, so a consumer whose partitions
	// all come back starts at once and an idle consumer never waits; busy
	// batches then hold about every partition, and commit about half as
	// often. 0 turns it off. Defaults to 0.
	BatchLinger time.Duration
	// BatchWorkers is how many batch transactions run at once, each on its
	// own connection. Defaults to DefaultBatchWorkers.
	BatchWorkers int

	// TxTimeout bounds one attempt (begin, handler, commit). The attempt does
	// not inherit the cancellation of the message context: a router shutting
	// down lets it finish instead of tearing down a commit whose outcome would
	// then be unknown. Defaults to DefaultTxTimeout.
	TxTimeout time.Duration

	// OnOutcome, when set, is called after each delivery is settled, for
	// metrics, logs and the chaos harness's narration. It must be fast.
	OnOutcome func(Event)
	// Logger receives what goes wrong (and, at Info, what an operator
	// wants to know, like a retry or a retention sweep). Defaults to
	// discarding it.
	Logger *slog.Logger

	// Standby, on a Postgres that replicates asynchronously, holds each
	// message's acknowledgement (the broker's offset) until the standbys a
	// failover would promote hold the transaction that settled it (see
	// package standby): no message is acknowledged whose inbox row a
	// failover can take back (lost: the broker would not deliver it
	// again). Nil: acknowledged once committed (one node, or synchronous
	// replication).
	Standby *standby.Gate
	// log is Logger as Watermill's adapter, the form the code logs through.
	log watermill.LoggerAdapter

	// OnDeadLetter is what a dead letter does to the later messages of its
	// partition key (Key): SkipKey applies them as they come, ahead of the
	// dead letter; HoldKey parks them (recorded, acknowledged, not applied)
	// until the dead letter is redriven or discarded, then applies them in
	// their arrival order (hold.go). Other keys flow either way. Defaults to
	// SkipKey.
	OnDeadLetter DeadLetterPolicy
	// Key returns a message's partition key, which HoldKey holds. A message
	// whose key is empty is never held. Defaults to the KeyMetadata entry
	// the outbox's relay keeps on every message (KeyFromMetadata);
	// inboxkafka.Key reads the Kafka record's key instead.
	Key func(*message.Message) string

	// disableDedupe skips the inbox row: every delivery runs the handler.
	// Only a failpoint build can set it (WithoutDedupe, control.go): the
	// chaos harness's control run must show double-applies without the
	// inbox. A default build has no way to switch the inbox off.
	disableDedupe bool
}

// The defaults of Config's zero fields.
const (
	DefaultMaxAttempts       = 5
	DefaultRetryBackoff      = 100 * time.Millisecond
	DefaultMaxRetryBackoff   = 5 * time.Second
	DefaultMaxPayloadBytes   = 1 << 20
	DefaultRedeliveryHorizon = 3 * 24 * time.Hour
	// DefaultRetention covers Kafka's default topic configs (retention.ms
	// and segment.ms of 7 days each) with a day to spare.
	DefaultRetention         = 15 * 24 * time.Hour
	DefaultRetentionBatch    = 5000
	DefaultRetentionInterval = time.Minute
	DefaultBatchWorkers      = 2
	DefaultTxTimeout         = 30 * time.Second
)

// setDefaults fills the zero fields. Negative values are left for Validate
// to refuse.
func (c *Config) setDefaults() {
	if c.MessageID == nil {
		c.MessageID = FromUUID
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = c.Consumer + ".dlq"
	}
	if c.TypeHeader == "" {
		c.TypeHeader = outbox.TypeMetadata
	}
	if c.Key == nil {
		c.Key = KeyFromMetadata(outbox.KeyMetadata)
	}
	c.log = watermill.NopLogger{}
	if c.Logger != nil {
		c.log = watermill.NewSlogLogger(c.Logger)
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, DefaultRetryBackoff)
	c.MaxRetryBackoff = cmp.Or(c.MaxRetryBackoff, DefaultMaxRetryBackoff)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.RedeliveryHorizon = cmp.Or(c.RedeliveryHorizon, DefaultRedeliveryHorizon)
	c.RetentionBatch = cmp.Or(c.RetentionBatch, DefaultRetentionBatch)
	c.RetentionInterval = cmp.Or(c.RetentionInterval, DefaultRetentionInterval)
	c.BatchSize = cmp.Or(c.BatchSize, 1)
	c.BatchWorkers = cmp.Or(c.BatchWorkers, DefaultBatchWorkers)
	c.TxTimeout = cmp.Or(c.TxTimeout, DefaultTxTimeout)
	if c.Partitions != nil {
		p := *c.Partitions // the caller's value stays as it was
		p.setDefaults()
		c.Partitions = &p
	}
}

// Validate reports the first invalid field. New calls it after filling in
// the defaults of zero fields, so zero is valid wherever a default exists.
func (c Config) Validate() error {
	f := check.Config("inbox: Config")
	f.Required("Pool", c.Pool != nil)
	f.Required("Consumer", c.Consumer != "")
	check.NotNegative(f, "MaxAttempts", c.MaxAttempts)
	check.NotNegative(f, "RetryBackoff", c.RetryBackoff)
	check.NotNegative(f, "MaxRetryBackoff", c.MaxRetryBackoff)
	check.NotNegative(f, "MaxPayloadBytes", c.MaxPayloadBytes)
	f.That(c.BatchSize >= 0, "BatchSize must not be negative (0 or 1: no batches)")
	check.NotNegative(f, "BatchWorkers", c.BatchWorkers)
	f.That(c.BatchLinger >= 0, "BatchLinger must not be negative")
	check.NotNegative(f, "RetentionBatch", c.RetentionBatch)
	check.NotNegative(f, "RetentionInterval", c.RetentionInterval)
	check.NotNegative(f, "TxTimeout", c.TxTimeout)
	f.That(c.OnDeadLetter == SkipKey || c.OnDeadLetter == HoldKey, "OnDeadLetter %d is neither SkipKey nor HoldKey", c.OnDeadLetter)
	f.That(c.OnDeadLetter != HoldKey || !c.disableDedupe, "OnDeadLetter HoldKey needs the inbox rows, and deduplication is off")
	f.That(c.RedriveTopic == "" || c.RedriveTopic != c.DeadLetterTopic, "RedriveTopic %q is the DeadLetterTopic: a redrive would be read as a dead letter's copy", c.RedriveTopic)
	f.That(c.LogStart == nil || c.Position != nil, "LogStart needs Config.Position: without positions every row goes by age alone")
	if c.Partitions != nil {
		f.Also(c.Partitions.withDefaults().validate())
		txTimeout, slack := cmp.Or(c.TxTimeout, DefaultTxTimeout), clearedSlack(cmp.Or(c.Retention, DefaultRetention))
		f.That(txTimeout < slack, "TxTimeout (%s) must be shorter than %s with Config.Partitions: "+
			"a partition is dropped only when no row in it was written that long before it was cleared", txTimeout, slack)
	}
	f.That(c.Retention >= c.RedeliveryHorizon, "Retention (%s) is shorter than Config.RedeliveryHorizon (%s): "+
		"a message redelivered after its inbox row was swept would be applied twice", c.Retention, c.RedeliveryHorizon)
	return f.Err()
}

// LogStart is, per topic and partition, the first offset Kafka still holds:
// a record below it was deleted (retention, DeleteRecords) and no consumer
// can read it again.
type LogStart map[string]map[int32]int64

// FromUUID takes the message id from the Watermill message UUID.
func FromUUID(msg *message.Message) (string, error) { return msg.UUID, nil }

// CanonicalUUID is a Config.CheckID for ids issued as UUIDs (pkg/outbox
// issues UUIDv7s): it accepts only the canonical text form, 36 lower-case
// hexadecimal digits and hyphens, so one UUID has one spelling.
func CanonicalUUID(id string) error {
	u, err := uuid.Parse(id)
	if err != nil {
		return fmt.Errorf("not a UUID: %w", err)
	}
	if u.String() != id {
		return fmt.Errorf("not a UUID in canonical form (%s)", u)
	}
	return nil
}

// FromMetadata takes the message id from a metadata entry (a Kafka header
// with watermill-kafka).
func FromMetadata(key string) func(*message.Message) (string, error) {
	return func(msg *message.Message) (string, error) { return msg.Metadata.Get(key), nil }
}

// KeyFromMetadata returns a Config.Key that reads the metadata entry name
// (a Kafka header with watermill-kafka).
func KeyFromMetadata(name string) func(*message.Message) string {
	return func(msg *message.Message) string { return msg.Metadata.Get(name) }
}

// Envelope is what a message's payload says about the record that carries
// it, for Config.Envelope. A field left empty is not compared.
//
// A record's envelope (its partition key, the topic it travels on, a type
// header, its id) decides where it goes and what the inbox and the
// consumer's checks look at: the key its partition and order, and what
// HoldKey holds; the topic who consumes it; the id what it is deduplicated
// by. Its payload decides what the handler does. Where the two disagree,
// the checks look at one entity and the handler changes another: an event
// for order B under order A's key is ordered among A's events, not B's,
// and parked with A's. A signature does not help (it proves who wrote the
// record, and a producer with a bug signs its bug), so the inbox compares
// them.
type Envelope struct {
	// Key is the partition key the payload belongs under (the entity it
	// concerns), compared with the record's (Config.Key).
	Key string
	// Topics are the topics a message of its type may travel on, compared
	// with the topic it was read from (where the router says which).
	Topics []string
	// Type is the payload's type, compared with the record's type header
	// (Config.TypeHeader) where it carries one.
	Type string
	// ID is the message id the payload names, compared with the id the
	// inbox deduplicates by (Config.MessageID).
	ID string
}

// DeadLetterPolicy is what a dead letter does to the later messages of its
// partition key (Config.OnDeadLetter).
type DeadLetterPolicy int

const (
	// SkipKey applies a dead letter's later messages as they come: the
	// partition goes on, and the dead letter, once redriven, is applied
	// after them. The default.
	SkipKey DeadLetterPolicy = iota
	// HoldKey parks the later messages of a dead letter's key until the
	// dead letter is redriven (and applied) or discarded; then they are
	// applied in their arrival order. Other keys flow.
	HoldKey
)

func (p DeadLetterPolicy) String() string {
	switch p {
	case SkipKey:
		return "skip-key"
	case HoldKey:
		return "hold-key"
	}
	return fmt.Sprintf("DeadLetterPolicy(%d)", int(p))
}

// Partitioning is Config.Partitions: inbox_messages partitioned by the time
// in each message's id (PartitionByIDTime converts the table), and retired
// by dropping whole partitions.
type Partitioning struct {
	// Interval is the span of id times one partition holds. Partitions
	// start at multiples of it since the Unix epoch (UTC). Defaults to
	// DefaultPartitionInterval.
	Interval time.Duration
	// Ahead is how many partitions past the current one are kept made.
	// Defaults to DefaultPartitionsAhead.
	Ahead int
	// Time returns the time a message id carries: every copy of a message
	// must give the same. An id it returns an error for is quarantined as
	// invalid. Defaults to UUIDv7Time, for ids from pkg/outbox.
	Time func(id string) (time.Time, error)
	// LockTimeout bounds the wait for the table's locks when a partition is
	// made or dropped: deliveries queue behind that wait, so it is short,
	// and a sweep that cannot have the locks tries again next time.
	// Defaults to DefaultPartitionLockTimeout.
	LockTimeout time.Duration
}

// The defaults of Partitioning's zero fields.
const (
	DefaultPartitionInterval    = 24 * time.Hour
	DefaultPartitionsAhead      = 3
	DefaultPartitionLockTimeout = 500 * time.Millisecond
)

func (p *Partitioning) setDefaults() {
	p.Interval = cmp.Or(p.Interval, DefaultPartitionInterval)
	p.Ahead = cmp.Or(p.Ahead, DefaultPartitionsAhead)
	p.LockTimeout = cmp.Or(p.LockTimeout, DefaultPartitionLockTimeout)
	if p.Time == nil {
		p.Time = UUIDv7Time
	}
}

func (p Partitioning) withDefaults() Partitioning {
	p.setDefaults()
	return p
}

func (p Partitioning) validate() error {
	return pgtable.CheckPartitioning("inbox: Partitioning", p.Interval, p.Ahead, p.LockTimeout)
}

// UUIDv7Time returns the creation time a UUIDv7 carries in its first 48
// bits (milliseconds since the Unix epoch), and an error for an id that is
// not a UUIDv7 in canonical form.
func UUIDv7Time(id string) (time.Time, error) {
	if err := CanonicalUUID(id); err != nil {
		return time.Time{}, err
	}
	u := uuid.MustParse(id)
	if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		return time.Time{}, fmt.Errorf("a UUID of version %d, not 7: it carries no creation time", u.Version())
	}
	ms := int64(u[0])<<40 | int64(u[1])<<32 | int64(u[2])<<24 | int64(u[3])<<16 | int64(u[4])<<8 | int64(u[5])
	return time.UnixMilli(ms).UTC(), nil
}

// clearedSlack is how long before the earliest clearance every row of a
// partition must have been written for the partition to be dropped: a row
// written after a consumer cleared the partition has a processed_at from
// its transaction's start, and an inbox transaction lasts far less (its
// TxTimeout, which Validate keeps below it). An hour, or half of Retention
// when that is shorter (a test's, a soak's). Each consumer records its own
// with its clearance, and a drop keeps the longest of those whose rows are
// in the partition.
func clearedSlack(retention time.Duration) time.Duration { return min(time.Hour, retention/2) }
