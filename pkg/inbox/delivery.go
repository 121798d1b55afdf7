package inbox

// The bottom of the delivery path: what one delivery is, how it is read
// from a message (and refused unread), the transaction context a handler
// writes through, and how its texts are made storable. The path itself
// (middleware.go, and beneath it batch.go, hold.go and rows.go) builds on
// these.

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// read returns the delivery of msg, and why it must be quarantined unread
// ("" when it can go on): the first refusal of in.stages (stages.go).
func (in *Inbox) read(msg *message.Message) (*delivery, string) {
	topic := topicOf(msg)
	d := &delivery{msg: msg, topic: topic, from: topic, start: time.Now(), sum: sha256.Sum256(msg.Payload)}
	if in.cfg.Position != nil {
		if p, o, ok := in.cfg.Position(msg); ok {
			d.part, d.offset = &p, &o
		}
	}
	for _, check := range in.stages {
		if reason := check(in, d); reason != "" {
			return d, reason
		}
	}
	return d, ""
}

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
		panic("inbox: no transaction in context; is the handler wrapped by Inbox.Middleware?")
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
