package inbox

// The bottom of the delivery path: what moves along it. The Inbox's state;
// one delivery, and a batch's item and result; the seams the path calls
// through (applier: the handler; keyPolicy: what a dead letter does to its
// key; stage: a check before the id is looked up); the transaction context
// a handler writes through. The path (middleware.go and the files beneath
// it) builds on these, and nothing here calls up into it.

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/gather"
	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// maxIDBytes bounds a message id: it is a key of btree indexes, whose entries
// Postgres caps at about 2.7 kB. A longer id is quarantined as invalid.
const maxIDBytes = 1024

// delivery is one message on its way through the middleware.
type delivery struct {
	msg   *message.Message
	id    string
	topic string // the topic it came from: its key's, its producer's
	// from is the topic it was read from, where its log holds it: topic,
	// or Config.RedriveTopic for a redrive's copy; "" for a parked message
	// applied from the inbox's own table (hold.go).
	from     string
	part     *int32 // where from's log holds it (Config.Position), nil when unknown
	offset   *int64
	sum      [32]byte
	attempts int // failed attempts recorded so far by this process
	start    time.Time

	seq      *keySeq  // its place in its key's history, if numbered (continuity.go)
	breaches []Breach // what its attempt's continuity check found

	key     string // its partition key, when it can be held (HoldKey)
	parked  bool   // a parked message a released key applies (hold.go)
	release bool   // its attempt released its key, or found it released: drain it

	// ticket marks the transaction that settled it, for Config.Standby:
	// its offset waits until the standbys hold it (heldByStandbys).
	ticket standby.Ticket
	marked bool
}

// logTopic is the topic whose log holds d at part and offset.
func (d *delivery) logTopic() string { return cmp.Or(d.from, d.topic) }

func (in *Inbox) txContext(d *delivery) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(d.msg.Context()), in.cfg.TxTimeout)
}

type txKey struct{}

// TxFromContext returns the transaction the inbox opened for the message
// being handled. The handler does its domain writes and its outbox writes on
// it, and must neither commit nor roll it back.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Tx is TxFromContext for handlers that run only behind the middleware. It
// panics when there is no transaction, which is a wiring error.
func Tx(ctx context.Context) pgx.Tx {
	tx, ok := TxFromContext(ctx)
	if !ok {
		panic("inbox: no transaction in context; is the handler behind the inbox's middleware?")
	}
	return tx
}

// storedKey is how a partition key is kept in the hold tables: as it is when
// it is text a btree index takes, else by its hash, so that any key can be
// held.
func storedKey(key string) string {
	if len(key) > maxIDBytes || key != schema.Text(key) {
		return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(key)))
	}
	return key
}

// Inbox deduplicates deliveries for one consumer. [Inbox.Middleware] wraps a
// Watermill handler, [Inbox.Handler] a set-based [BatchFunc]; [Inbox.Run]
// runs its background work: batch transactions and the retention sweep.
type Inbox struct {
	cfg      Config
	spanName string    // "inbox <consumer>"
	keys     keyPolicy // what a dead letter does to its key (Config.OnDeadLetter, hold.go)
	stages   []stage   // what a delivery passes before its id is looked up (stages.go)
	batch    batcher
	running  atomic.Bool     // Run was called and has not returned
	ready    atomic.Bool     // and its batch workers take deliveries
	stats    [7]atomic.Int64 // indexed by outcomeIndex
	shapeOK  atomic.Bool     // inbox_messages's shape matches Config.Partitions (partition.go)
}

// keySeq is a delivery's place in its key's history.
type keySeq struct {
	key    string // as stored (storedKey)
	stream string
	n      int64
}

// batchItem is one delivery waiting for a batch.
type batchItem struct {
	d    *delivery
	a    applier
	done chan batchResult
}

// batchResult is what the batch did with one delivery.
type batchResult struct {
	outcome  Outcome // Applied, Duplicate or Conflict: committed with the batch
	reason   string
	herr     error // the handler failed; its savepoint was rolled back
	fallback bool  // the batch failed as a whole: try the delivery alone
}

// batcher feeds deliveries to the workers Run starts (pkg/gather). queue is
// nil while Run is not running; mu keeps a Put from meeting a closed queue.
type batcher struct {
	mu    sync.RWMutex
	queue *gather.Queue[*batchItem]
}

// applier applies messages new to the consumer in the inbox's transaction,
// and must neither commit nor roll it back. An error fails every message of
// the call.
type applier interface {
	apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
	// setBased reports whether one call may take several messages; a
	// per-message applier gets a savepoint per message in a batch.
	setBased() bool
}

// keyPolicy is what the delivery path asks of a delivery's partition key:
// Config.OnDeadLetter, chosen once when the Inbox is built.
type keyPolicy interface {
	// admit writes d's inbox row in tx (the one INSERT, insertRows) and
	// returns "" when d is fresh: the attempt applies it. Otherwise it
	// returns how d settles, written in tx, its handler not to run: seen
	// before (classifySeen), or parked. It commits nothing.
	admit(ctx context.Context, tx pgx.Tx, d *delivery) (settled Outcome, reason string, err error)
	// recordDeadLetter writes, in tx, d's inbox row as dead-lettered and its
	// quarantine, and returns DeadLettered; or how d settles against a row
	// that was there first (classifySeen), its dead letter not written; or
	// "" when another delivery settled it. It commits nothing.
	recordDeadLetter(ctx context.Context, tx pgx.Tx, d *delivery, reason string) (settled Outcome, seenReason string, err error)
	// batchable returns the indexes of the items a batch may run in tx; it
	// marks the others, in results, to be tried alone.
	batchable(ctx context.Context, tx pgx.Tx, items []*batchItem, results []batchResult) ([]int, error)
	// afterCommit runs once d's transaction has committed, before d is
	// acknowledged.
	afterCommit(d *delivery, a applier) error
}

// A stage checks one thing of a delivery before its id is looked up, and
// says why the delivery must be quarantined as invalid ("" to go on). A
// delivery passes the stages its consumer's Config asks for, in the order
// newStages lists them; a check that is not configured is not in the list
// and costs nothing. Each optional stage lives in its feature's file.
type stage func(in *Inbox, d *delivery) string

// topicKey carries the topic Deliver was given in the message's context.
type topicKey struct{}

// topicOf is the topic msg was read from: Deliver's, or the one Watermill's
// router put in its context.
func topicOf(msg *message.Message) string {
	if topic, ok := msg.Context().Value(topicKey{}).(string); ok {
		return topic
	}
	return message.SubscribeTopicFromCtx(msg.Context())
}
