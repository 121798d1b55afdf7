package inboxkafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// ErrStalled is what Watchdog.Run returns when a partition this consumer
// holds has records waiting and hands none of them to the handler.
var ErrStalled = errors.New("inboxkafka: consumer stalled")

// DefaultStallTimeout is WatchdogConfig.Timeout's default: well above the
// inbox's DefaultTxTimeout, so one attempt that runs long is never taken
// for a stall.
const DefaultStallTimeout = 2 * time.Minute

// WatchdogConfig configures a Watchdog.
type WatchdogConfig struct {
	// Brokers and Sarama are the admin client's (Sarama: the consumer's
	// login, any client.id). Required.
	Brokers []string
	Sarama  *sarama.Config
	// Group and Topic are the consumer group and the topic it consumes.
	// Required.
	Group, Topic string
	// ClientID is the consumer's client.id, by which the group names the
	// member that holds each partition. Each replica needs its own (the
	// Watchdog acts on none it cannot tell apart). Required.
	ClientID string
	// Timeout is how long a partition the consumer holds may have records
	// waiting, its committed offset not moving, and no delivery of it in
	// the handler, before Run returns ErrStalled. Defaults to
	// DefaultStallTimeout.
	Timeout time.Duration
	// Interval is how often the group is read. Defaults to Timeout / 6.
	Interval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnRead, when set, is given each reading of the group (for metrics).
	OnRead func([]PartitionLag)
	// OnSkipped, when set, is given each range of records the broker lost
	// under the group (PartitionLag.Skipped), at every reading that shows
	// it: Inbox.RecordSkipped records it once. A truncation is given once
	// per committed offset it was seen under.
	OnSkipped func(inbox.SkippedRange)
}

// PartitionLag is where a consumer group stands on one partition.
type PartitionLag struct {
	Partition int32
	Committed int64  // the group's committed offset; -1 when it committed none
	Start     int64  // the log start offset: the first record Kafka still holds
	End       int64  // the log end offset (high watermark)
	Owner     string // the client.id of the member holding it; "" during a rebalance
	Members   int    // how many members of the group have that client.id
}

// Lag is how many records Kafka holds past the committed offset: those the
// group has still to read. Records deleted before it read them are not
// (Skipped says which).
func (p PartitionLag) Lag() int64 { return max(0, p.End-max(p.Committed, p.Start, 0)) }

// Skipped returns the records of topic's partition the group will never
// read, or whose log is gone from under its committed offset: the log
// start past the committed offset (deleted before it read them), or the
// log end below it (truncated: the topic recreated, or an unclean leader
// election). A group that committed nothing skipped nothing: it starts at
// the log start.
func (p PartitionLag) Skipped(topic string) (inbox.SkippedRange, bool) {
	r := inbox.SkippedRange{Topic: topic, Partition: p.Partition}
	switch {
	case p.Committed < 0:
		return r, false
	case p.Start > p.Committed:
		r.From, r.To, r.Cause = p.Committed, p.Start, inbox.Deleted
	case p.End < p.Committed:
		r.From, r.To, r.Cause = p.End, p.Committed, inbox.Truncated
	default:
		return r, false
	}
	return r, true
}

// Watchdog notices a Kafka consumer that holds a partition with records
// waiting and hands none of them to its handler: a stall that no error
// reports. Sarama's consumer group can fall into one while its session
// heartbeats on: a claim waiting for a partition leader its cached metadata
// never learns (after every broker went away at once), a fetch or a
// delivery that never returns. The group sees a live member, the member
// sees no error, and the partition's lag grows until the next rebalance,
// which a quiet group may never have.
//
// Every Interval it reads, with an admin client of its own, the group's
// committed offsets, the log end offsets and which member holds each
// partition. A partition this consumer holds (found by ClientID) is
// stalled when, for Timeout, it had records past the committed offset, the
// committed offset did not move, and no delivery of it began or ended in
// the handler (Middleware sees them: a handler retrying a message is not
// stalled; one that never returns is). Run then returns ErrStalled; a
// service exits on it so its supervisor starts it again, with a new
// session and new claims. A reading that fails, a rebalance, or a
// partition moving to another member starts the clock again: the Watchdog
// never acts on what it could not see.
//
// The same readings show what the broker lost under the group: a log start
// past the committed offset (records deleted before the consumer read
// them), a log end below it (the topic recreated, an unclean leader
// election). Those are given to OnSkipped, and are no lag: a partition
// whose every waiting record was deleted is not stalled (Sarama, started
// again, begins such a partition at its log start).
type Watchdog struct {
	cfg WatchdogConfig

	mu         sync.Mutex
	deliveries map[int32]time.Time // partition → when a delivery of it last began or ended
	inFlight   map[int32]int       // partition → deliveries in the handler now
	// next is, per partition, the offset its next delivery should have:
	// after the last delivery, or the committed offset read since. A
	// delivery past it is a jump (Sarama, its committed offset out of
	// range, starts the partition again at its log start, and says nothing
	// but "Sarama internal error"): jumps waits for the next reading, which
	// tells a range the broker deleted from a gap compaction left.
	next  map[int32]int64
	jumps []jump
}

// jump is a delivery at offset to where from was expected, at a time.
type jump struct {
	partition int32
	from, to  int64
	at        time.Time
}

// NewWatchdog returns a Watchdog; Run it beside the consumer and wrap the
// consumer's handler with Middleware.
func NewWatchdog(cfg WatchdogConfig) (*Watchdog, error) {
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultStallTimeout)
	cfg.Interval = cmp.Or(cfg.Interval, cfg.Timeout/6)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	switch {
	case len(cfg.Brokers) == 0 || cfg.Sarama == nil:
		return nil, errors.New("inboxkafka: WatchdogConfig.Brokers and Sarama are required")
	case cfg.Group == "" || cfg.Topic == "":
		return nil, errors.New("inboxkafka: WatchdogConfig.Group and Topic are required")
	case cfg.ClientID == "":
		return nil, errors.New("inboxkafka: WatchdogConfig.ClientID is required (the consumer's client.id, one per replica)")
	case cfg.Timeout < 0 || cfg.Interval <= 0 || cfg.Interval > cfg.Timeout:
		return nil, fmt.Errorf("inboxkafka: WatchdogConfig.Interval (%s) must be positive and at most Timeout (%s)", cfg.Interval, cfg.Timeout)
	}
	return &Watchdog{cfg: cfg, deliveries: map[int32]time.Time{}, inFlight: map[int32]int{}, next: map[int32]int64{}}, nil
}

// Middleware records, per partition, when a delivery began and ended, and
// a delivery past the offset the partition's next should have had.
func (w *Watchdog) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		p, ok := kafka.MessagePartitionFromCtx(msg.Context())
		if !ok {
			return h(msg)
		}
		if o, ok := kafka.MessagePartitionOffsetFromCtx(msg.Context()); ok {
			w.delivered(p, o)
		}
		w.delivery(p, +1)
		defer w.delivery(p, -1)
		return h(msg)
	}
}

// delivered notes that a delivery of p at offset o began.
func (w *Watchdog) delivered(p int32, o int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if next, ok := w.next[p]; ok && o > next {
		w.jumps = append(w.jumps, jump{partition: p, from: next, to: o, at: time.Now()})
	}
	w.next[p] = max(w.next[p], o+1)
}

// nextOf is the offset partition p's next delivery should have, or -1.
func (w *Watchdog) nextOf(p int32) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if next, ok := w.next[p]; ok {
		return next
	}
	return -1
}

// expect moves each partition's next expected offset up to its committed
// one (and forgets it for a partition another member holds, whose deliveries
// this one does not see), and returns the jumps noted since the last reading.
func (w *Watchdog) expect(lags []PartitionLag) []jump {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range lags {
		if l.Owner != "" && l.Owner != w.cfg.ClientID {
			delete(w.next, l.Partition) // another member reads it now: what it skips is its own to tell
			continue
		}
		next, ok := w.next[l.Partition]
		switch {
		case l.Committed >= 0 && (!ok || l.Committed > next):
			w.next[l.Partition] = l.Committed
		case l.Committed < 0 && !ok && l.Owner == w.cfg.ClientID:
			w.next[l.Partition] = l.Start // nothing committed: its claim began at the log start (Offsets.Initial, the oldest)
		}
	}
	jumps := w.jumps
	w.jumps = nil
	return jumps
}

func (w *Watchdog) delivery(p int32, d int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deliveries[p] = time.Now()
	w.inFlight[p] += d
}

// lastDelivery reports when a delivery of p last began or ended, and
// whether one is in the handler now.
func (w *Watchdog) lastDelivery(p int32) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deliveries[p], w.inFlight[p] > 0
}

// watch is what the Watchdog remembers of a partition between readings.
type watch struct {
	committed int64
	since     time.Time // when it was last seen progressing, idle, or not ours
}

// Run reads the group every Interval until ctx ends (nil) or a partition
// stalls (an error wrapping ErrStalled, naming it).
func (w *Watchdog) Run(ctx context.Context) error {
	watched := map[int32]*watch{}
	truncations := map[int32]int64{} // partition → the committed offset a truncation was told under
	var prevRead time.Time           // when the last reading began
	var client sarama.Client
	defer func() {
		if client != nil {
			client.Close()
		}
	}()
	tick := time.NewTicker(w.cfg.Interval)
	defer tick.Stop()
	for first := true; ; first = false {
		if !first { // the first reading at once: the offsets the consumer starts from
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
		var err error
		if client == nil {
			client, err = sarama.NewClient(w.cfg.Brokers, w.cfg.Sarama)
		}
		var lags []PartitionLag
		readAt := time.Now()
		if err == nil {
			lags, err = ReadGroupLag(client, w.cfg.Group, w.cfg.Topic)
		}
		if err != nil {
			w.cfg.Logger.Warn("consumer watchdog: reading the group; its clock starts again", "group", w.cfg.Group, "topic", w.cfg.Topic, "err", err)
			clear(watched) // what it could not see is not a stall
			if client != nil {
				client.Close()
				client = nil
			}
			continue
		}
		if w.cfg.OnRead != nil {
			w.cfg.OnRead(lags)
		}
		w.skipped(lags, prevRead, readAt, w.expect(lags), truncations)
		prevRead = readAt
		if err := w.check(lags, watched, time.Now()); err != nil {
			return err
		}
	}
}

// skipped gives OnSkipped the ranges lags show the broker lost (a deleted
// range once no delivery of its partition began or ended since prevRead, a
// truncation once per committed offset), and the jumps a delivery made
// over records the log start has since passed (deleted: Sarama started the
// partition again at its log start, and may have committed past them
// already).
func (w *Watchdog) skipped(lags []PartitionLag, prevRead, readAt time.Time, jumps []jump, truncations map[int32]int64) {
	if w.cfg.OnSkipped == nil {
		return
	}
	starts := map[int32]int64{}
	for _, l := range lags {
		starts[l.Partition] = l.Start
	}
	for _, j := range jumps {
		switch start, ok := starts[j.partition]; {
		case ok && start > j.from:
			w.cfg.OnSkipped(inbox.SkippedRange{Topic: w.cfg.Topic, Partition: j.partition, From: j.from, To: min(j.to, start), Cause: inbox.Deleted})
		case j.at.After(readAt):
			w.mu.Lock() // noted while the group was read: the next reading tells
			w.jumps = append(w.jumps, j)
			w.mu.Unlock()
		}
	}
	for _, l := range lags {
		// Deleted: the log start past where this member reads the
		// partition from: its committed offset, or past what it delivered
		// (not committed yet: read), or, committed nothing, the log start
		// its claim began at (expect).
		if pos := max(l.Committed, w.nextOf(l.Partition)); pos >= 0 && l.Start > pos {
			// Records a fetch brought in before the log start moved are
			// delivered still: told once the partition is quiet.
			if last, inFlight := w.lastDelivery(l.Partition); !inFlight && !last.After(prevRead) {
				w.cfg.OnSkipped(inbox.SkippedRange{Topic: w.cfg.Topic, Partition: l.Partition, From: pos, To: l.Start, Cause: inbox.Deleted})
			}
			continue
		}
		r, ok := l.Skipped(w.cfg.Topic)
		if !ok || r.Cause != inbox.Truncated {
			continue
		}
		if told, seen := truncations[l.Partition]; seen && told == l.Committed {
			continue
		}
		truncations[l.Partition] = l.Committed
		w.cfg.OnSkipped(r)
	}
}

// check holds one reading to the last ones.
func (w *Watchdog) check(lags []PartitionLag, watched map[int32]*watch, now time.Time) error {
	var stalled []string
	for _, l := range lags {
		wt := watched[l.Partition]
		ours := l.Owner == w.cfg.ClientID && l.Members == 1 // not one it cannot tell apart from another
		if wt == nil || !ours || l.Lag() <= 0 || l.Committed != wt.committed {
			watched[l.Partition] = &watch{committed: l.Committed, since: now}
			continue
		}
		last, inFlight := w.lastDelivery(l.Partition)
		quiet := now.Sub(latest(wt.since, last))
		if quiet < w.cfg.Timeout {
			continue
		}
		what := "no delivery reached the handler"
		if inFlight {
			what = "a delivery has been in the handler all along"
		}
		if r, ok := l.Skipped(w.cfg.Topic); ok {
			what += fmt.Sprintf("; before them, %s: a consumer started again begins at the log start", r)
		}
		stalled = append(stalled, fmt.Sprintf("%s/%d: %d records past the committed offset %d for %s, %s",
			w.cfg.Topic, l.Partition, l.Lag(), l.Committed, quiet.Round(time.Second), what))
	}
	if len(stalled) == 0 {
		return nil
	}
	sort.Strings(stalled)
	return fmt.Errorf("%w: group %s, member %s: %s", ErrStalled, w.cfg.Group, w.cfg.ClientID, strings.Join(stalled, "; "))
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// ReadGroupLag reads where group stands on every partition of topic: its
// committed offsets, the log start and end offsets, and the member (by
// client.id) holding each partition.
func ReadGroupLag(client sarama.Client, group, topic string) ([]PartitionLag, error) {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	// Not admin.Close: it would close the client, which the caller owns.
	if err := client.RefreshMetadata(topic); err != nil {
		return nil, fmt.Errorf("inboxkafka: reading %s's partitions: %w", topic, err)
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: reading %s's partitions: %w", topic, err)
	}
	committed, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: reading group %s's offsets: %w", group, err)
	}
	if committed.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("inboxkafka: reading group %s's offsets: %w", group, committed.Err)
	}
	desc, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return nil, fmt.Errorf("inboxkafka: describing group %s: %w", group, err)
	}
	owners, members := map[int32]string{}, map[string]int{}
	for _, d := range desc {
		if d.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("inboxkafka: describing group %s: %w", group, d.Err)
		}
		if d.State != "Stable" {
			continue // assignments in flux: nobody holds anything yet
		}
		for _, m := range d.Members {
			members[m.ClientId]++
			a, err := m.GetMemberAssignment()
			if err != nil || a == nil {
				continue
			}
			for _, p := range a.Topics[topic] {
				owners[p] = m.ClientId
			}
		}
	}
	out := make([]PartitionLag, 0, len(parts))
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("inboxkafka: reading %s/%d's end: %w", topic, p, err)
		}
		start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("inboxkafka: reading %s/%d's log start: %w", topic, p, err)
		}
		l := PartitionLag{Partition: p, Committed: -1, Start: start, End: end, Owner: owners[p], Members: members[owners[p]]}
		if b := committed.GetBlock(topic, p); b != nil {
			if b.Err != sarama.ErrNoError {
				return nil, fmt.Errorf("inboxkafka: reading group %s's offset of %s/%d: %w", group, topic, p, b.Err)
			}
			l.Committed = b.Offset
		}
		out = append(out, l)
	}
	return out, nil
}
