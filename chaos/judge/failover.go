package judge

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The two invariants a replicated Postgres adds, which no run on one node
// could see fail: a failover that loses the last transactions the old
// primary committed (asynchronous replication) breaks them.
const (
	// NoGhosts: every event a consumer applied has its cause in the
	// producer's database as it stands after the run: its outbox row,
	// written in the transaction of the change that caused it. An event
	// the relay published from a primary whose transaction a failover then
	// lost is a ghost.
	NoGhosts = "no-ghost-events"
	// CommittedApplied: every record below its consumer group's committed
	// offset was recorded by that consumer's inbox (applied, dead-lettered,
	// parked or quarantined). An offset committed after an inbox
	// transaction a failover then lost leaves a message nobody will apply:
	// the broker never delivers it again.
	CommittedApplied = "committed-applied"
)

// Flow is one topic from its producer's outbox to its consumer's inbox.
type Flow struct {
	Topic    string
	Producer *pgxpool.Pool // holds the outbox the topic's events are written to
	Consumer *pgxpool.Pool // holds the inbox that records them
	Name     string        // the consumer's inbox name (Config.Consumer) and its Kafka group
}

// FlowState is what the two checks read of one flow after a run.
type FlowState struct {
	Topic string
	// Outbox holds the message ids of the producer's outbox rows for the
	// topic; Inbox the ids its consumer's inbox recorded as applied;
	// Recorded every id it recorded in any way (inbox rows of any status,
	// quarantine rows).
	Outbox, Applied, Recorded map[string]bool
	// Committed is the group's committed offset per partition (-1: none).
	Committed map[int32]int64
}

// ReadFlow reads a flow's state: both databases as they stand, and the
// group's committed offsets.
func ReadFlow(ctx context.Context, f Flow, lags []PartitionLag) (FlowState, error) {
	st := FlowState{Topic: f.Topic, Outbox: map[string]bool{}, Applied: map[string]bool{}, Recorded: map[string]bool{}, Committed: map[int32]int64{}}
	read := func(pool *pgxpool.Pool, into map[string]bool, q string, args ...any) error {
		rows, err := pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			into[id] = true
		}
		return rows.Err()
	}
	if err := read(f.Producer, st.Outbox, `SELECT message_id::text FROM outbox_messages WHERE topic = $1`, f.Topic); err != nil {
		return st, fmt.Errorf("reading the outbox of %s: %w", f.Topic, err)
	}
	if err := read(f.Consumer, st.Applied, `SELECT message_id FROM inbox_messages WHERE consumer = $1 AND topic = $2 AND status = 'processed'`,
		f.Name, f.Topic); err != nil {
		return st, fmt.Errorf("reading the inbox of %s: %w", f.Name, err)
	}
	if err := read(f.Consumer, st.Recorded, `SELECT message_id FROM inbox_messages WHERE consumer = $1 AND topic = $2
		UNION SELECT message_id FROM inbox_quarantine WHERE consumer = $1 AND topic = $2`, f.Name, f.Topic); err != nil {
		return st, fmt.Errorf("reading the inbox of %s: %w", f.Name, err)
	}
	for _, l := range lags {
		if l.Topic == f.Topic && l.Group == f.Name {
			st.Committed[l.Partition] = l.Committed
		}
	}
	return st, nil
}

// GhostsVerdict judges NoGhosts: each applied id of each flow must be in
// its producer's outbox. ignore holds the ids of messages the harness
// forged or replayed itself (hostile messages): their cause is the
// harness.
func GhostsVerdict(flows []FlowState, ignore map[string]bool) (ok bool, detail string) {
	var ghosts []string
	applied := 0
	for _, f := range flows {
		for id := range f.Applied {
			if ignore[id] {
				continue
			}
			applied++
			if !f.Outbox[id] {
				ghosts = append(ghosts, f.Topic+" "+id)
			}
		}
	}
	sort.Strings(ghosts)
	if len(ghosts) == 0 {
		return true, fmt.Sprintf("every one of %d applied events has its outbox row in its producer's database", applied)
	}
	return false, fmt.Sprintf("%d of %d applied events have no cause in their producer's database (ghosts): %s",
		len(ghosts), applied, brief(ghosts))
}

// CommittedVerdict judges CommittedApplied: every record of each flow's
// topic below its group's committed offset was recorded by the consumer.
// records is what Kafka holds; ignore as for GhostsVerdict.
func CommittedVerdict(flows []FlowState, records []Record, ignore map[string]bool) (ok bool, detail string) {
	var lost []string
	below := 0
	for _, f := range flows {
		for _, r := range records {
			c, known := f.Committed[r.Partition]
			if r.Topic != f.Topic || !known || r.Offset >= c || r.ID == "" || ignore[r.ID] {
				continue
			}
			below++
			if !f.Recorded[r.ID] {
				lost = append(lost, fmt.Sprintf("%s/%d@%d %s", r.Topic, r.Partition, r.Offset, r.ID))
			}
		}
	}
	sort.Strings(lost)
	if len(lost) == 0 {
		return true, fmt.Sprintf("every one of %d records below its group's committed offset is in its consumer's inbox", below)
	}
	return false, fmt.Sprintf("%d of %d records below their group's committed offset are in no inbox: committed, never applied (lost): %s",
		len(lost), below, brief(lost))
}

// brief lists the first few of many.
func brief(items []string) string {
	const show = 5
	if len(items) <= show {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:show], ", ") + fmt.Sprintf(", … (%d more)", len(items)-show)
}

// Stall is one service's flow around one failover, from its rows' own
// timestamps.
type Stall struct {
	// RelayS and ConsumerS are the longest time within the window in which
	// its relay published nothing (outbox_messages.published_at) and its
	// consumer applied nothing (inbox_messages.processed_at).
	RelayS    float64 `json:"relay_stall_s"`
	ConsumerS float64 `json:"consumer_stall_s"`
	// DrainedS is how long after back the last outbox row committed
	// before back was published: the backlog drained.
	DrainedS float64 `json:"backlog_drained_s"`
}

// MeasureStall measures a service's Stall in the window [from, to] around a
// failover whose new primary took writes at back.
func MeasureStall(ctx context.Context, pool *pgxpool.Pool, from, to, back time.Time) (Stall, error) {
	var st Stall
	err := pool.QueryRow(ctx, `
		SELECT
		  (SELECT coalesce(max(gap), 0) FROM (SELECT extract(epoch FROM published_at - lag(published_at) OVER (ORDER BY published_at))::float8 AS gap
		     FROM outbox_messages WHERE published_at BETWEEN $1 AND $2) g),
		  (SELECT coalesce(max(gap), 0) FROM (SELECT extract(epoch FROM processed_at - lag(processed_at) OVER (ORDER BY processed_at))::float8 AS gap
		     FROM inbox_messages WHERE processed_at BETWEEN $1 AND $2) g),
		  (SELECT coalesce(extract(epoch FROM max(published_at) - $3)::float8, 0)
		     FROM outbox_messages WHERE created_at <= $3 AND published_at >= $3)`,
		from, to, back).Scan(&st.RelayS, &st.ConsumerS, &st.DrainedS)
	return st, err
}
