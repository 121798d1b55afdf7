package inbox

// The rows a delivery writes, in the order the path (middleware.go) asks for
// them: first its key's policy (keyPolicy: skipKey here, or holdKey, which
// writes inside the key's hold, all of it in hold.go), then beneath it the
// inbox row, written by the inbox's one INSERT, and the continuity of the
// keys of the rows it wrote (what it checks is in continuity.go); what a
// copy whose row is there already leaves (a duplicate counted, a conflict
// quarantined); and a quarantine row, its metadata encoded as a jsonb
// column takes it.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
)

// The status an inbox row is written with: its message was applied,
// dead-lettered (finished, not applied), or parked (not applied yet: its key
// is held, hold.go).
const (
	rowProcessed    = "processed"
	rowDeadLettered = "dead_lettered"
	rowParked       = "parked"
)

// skipKey is SkipKey: a dead letter leaves its key alone, and the policy
// only writes the inbox rows.
type skipKey struct{ in *Inbox }

func (s skipKey) admit(ctx context.Context, tx pgx.Tx, d *delivery) (Outcome, string, error) {
	return s.in.insertRow(ctx, tx, d, rowProcessed)
}

// insertRow writes d's inbox row with status and returns "" when it is
// fresh; a copy seen before settles against the row that is there
// (classifySeen), and it returns how.
func (in *Inbox) insertRow(ctx context.Context, tx pgx.Tx, d *delivery, status string) (Outcome, string, error) {
	fresh, err := in.insertRows(ctx, tx, []*delivery{d}, status)
	if err != nil || len(fresh) > 0 {
		return "", "", err
	}
	return in.classifySeen(ctx, tx, d, "")
}

func (s skipKey) recordDeadLetter(ctx context.Context, tx pgx.Tx, d *delivery, reason string) (Outcome, string, error) {
	in := s.in
	if !in.cfg.disableDedupe && !d.parked { // a parked message's row is there (holdKey.recordDeadLetter)
		fresh, err := in.insertRows(ctx, tx, []*delivery{d}, rowDeadLettered)
		if err != nil {
			return "", "", err
		}
		if len(fresh) == 0 {
			// Another delivery of the id finished first: often one that
			// waited on this delivery's row and was applied once this
			// one's failed attempt rolled back. Its payload may be
			// another, so this one is settled against its row like any
			// redelivery, never taken for a duplicate unseen.
			return in.classifySeen(ctx, tx, d, reason)
		}
	}
	return DeadLettered, "", in.insertQuarantine(ctx, tx, d, KindDeadLetter, reason, nil)
}

// insertRows is the inbox's one INSERT: it writes the rows of ds with status
// in one statement, ON CONFLICT DO NOTHING, and returns the indexes of the
// deliveries whose row it inserted: the others were seen before. Rows go in
// in id order, so two batches that share ids wait for each other instead of
// deadlocking. When one id comes twice, its first delivery is the fresh one.
func (in *Inbox) insertRows(ctx context.Context, tx pgx.Tx, ds []*delivery, status string) ([]int, error) {
	order := make([]int, len(ds))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(ds[a].id, ds[b].id) })
	ids := make([]string, len(ds))
	sums := make([][]byte, len(ds))
	topics := make([]string, len(ds))
	parts := make([]*int32, len(ds))
	offsets := make([]*int64, len(ds))
	for j, i := range order {
		ids[j], sums[j], topics[j] = ds[i].id, ds[i].sum[:], ds[i].logTopic()
		parts[j], offsets[j] = ds[i].part, ds[i].offset
	}
	insert, args, err := in.insertSQL(ids, sums, topics, parts, offsets, status)
	if err != nil {
		return nil, err
	}
	if in.cfg.Partitions != nil {
		args = append([]any{schema.PlanEachTime}, args...)
	}
	rows, err := tx.Query(ctx, insert, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: inserting inbox rows: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox: inserting inbox rows: %w", err)
	}
	var fresh []int
	for _, i := range order {
		if k := slices.Index(inserted, ds[i].id); k >= 0 {
			inserted = slices.Delete(inserted, k, k+1) // a second delivery of the id is not fresh
			fresh = append(fresh, i)
		}
	}
	slices.Sort(fresh)
	if err := in.checkContinuity(ctx, tx, ds, fresh); err != nil {
		return nil, err
	}
	return fresh, nil
}

// insertSQL is the inbox rows' INSERT and its arguments: the rows' columns
// in id order, and in a partitioned inbox each id's time.
func (in *Inbox) insertSQL(ids []string, sums [][]byte, topics []string, parts []*int32, offsets []*int64, status string) (insert string, args []any, err error) {
	if in.cfg.Partitions == nil {
		insert = `
			INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic, kafka_partition, kafka_offset, status)
			SELECT $1, u.id, u.sum, u.topic, u.part, u.off, $7
			FROM unnest($2::text[], $3::bytea[], $4::text[], $5::int[], $6::bigint[]) AS u(id, sum, topic, part, off)
			ON CONFLICT DO NOTHING
			RETURNING message_id`
		args = []any{in.cfg.Consumer, ids, sums, topics, parts, offsets, status}
	} else {
		times := make([]time.Time, len(ids))
		for j, id := range ids {
			if times[j], err = in.cfg.Partitions.Time(id); err != nil { // read quarantined such ids
				return "", nil, fmt.Errorf("inbox: the time of message id %q: %w", id, err)
			}
		}
		// Each row goes to the partition of its id's time, where every copy
		// of its message goes. A row written without a time (before the
		// table was partitioned, or by a consumer without Config.Partitions)
		// sorts before every time: a copy of its message is seen there,
		// whatever its id's time. The ON CONFLICT has no target: it honours
		// the first partition's own (consumer, message_id) index too
		// (docs/partitioning.md).
		insert = `
			INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic, kafka_partition, kafka_offset, status, msg_time)
			SELECT $1, u.id, u.sum, u.topic, u.part, u.off, $7, u.t
			FROM unnest($2::text[], $3::bytea[], $4::text[], $5::int[], $6::bigint[], $8::timestamptz[]) AS u(id, sum, topic, part, off, t)
			WHERE NOT EXISTS (SELECT 1 FROM inbox_messages o WHERE o.consumer = $1 AND o.message_id = u.id AND o.msg_time = '-infinity')
			ON CONFLICT DO NOTHING
			RETURNING message_id`
		args = []any{in.cfg.Consumer, ids, sums, topics, parts, offsets, status, times}
	}
	return insert, args, nil
}

// checkContinuity checks the numbered deliveries of ds[fresh], new to the
// consumer, in arrival order, against their keys' state (continuitySQL,
// continuity.go), in tx: it writes the breaches, moves the state, and keeps
// each delivery's breaches for settle (the others' are cleared: an attempt
// that rolled back leaves none). One statement per delivery, all sent in
// one round trip and run in order, so a batch's messages of one key each
// meet the state the one before left.
func (in *Inbox) checkContinuity(ctx context.Context, tx pgx.Tx, ds []*delivery, fresh []int) error {
	for _, d := range ds {
		d.breaches = nil
	}
	var of []*delivery
	batch := &pgx.Batch{}
	for _, i := range fresh {
		if d := ds[i]; d.seq != nil {
			of = append(of, d)
			batch.Queue(continuitySQL, in.cfg.Consumer, d.topic, d.seq.key, d.seq.stream, d.seq.n, d.id)
		}
	}
	if len(of) == 0 {
		return nil
	}
	results := tx.SendBatch(ctx, batch)
	for _, d := range of {
		rows, _ := results.Query() // an error comes back from CollectRows
		found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Breach])
		if err != nil {
			_ = results.Close()
			return fmt.Errorf("inbox: checking continuity: %w", err)
		}
		d.breaches = found
	}
	if err := results.Close(); err != nil {
		return fmt.Errorf("inbox: checking continuity: %w", err)
	}
	return nil
}

// classifySeen writes, in tx, what a delivery of an already-recorded id
// leaves behind: the duplicate counted durably (only redeliveries pay for
// this write), or the conflicting payload quarantined with both hashes. It
// commits nothing. Every path that finds the id's inbox row already there
// settles through it: one that settled without comparing the hashes would
// drop a different payload as a duplicate. failed, when not empty, is why
// this delivery was being dead-lettered, kept in the conflict's reason.
func (in *Inbox) classifySeen(ctx context.Context, tx pgx.Tx, d *delivery, failed string) (Outcome, string, error) {
	var prior []byte
	var status string
	if err := tx.QueryRow(ctx, `SELECT payload_sha256, status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`+in.rowTime(d.id, 3),
		in.rowArgs(d.id, in.cfg.Consumer, d.id)...).Scan(&prior, &status); err != nil {
		return "", "", fmt.Errorf("inbox: reading inbox row: %w", err)
	}
	if bytes.Equal(prior, d.sum[:]) {
		if err := in.recordCopy(ctx, tx, d, 1); err != nil {
			return "", "", fmt.Errorf("inbox: counting duplicate: %w", err)
		}
		return Duplicate, "", nil
	}
	// A conflicting copy Kafka still holds would be applied if its row
	// were swept: the row stays while Kafka holds it too.
	if err := in.recordCopy(ctx, tx, d, 0); err != nil {
		return "", "", fmt.Errorf("inbox: recording the conflicting copy's offset: %w", err)
	}
	done := "applied"
	switch status {
	case rowDeadLettered:
		done = "dead-lettered" // so an operator does not look for its effects
	case rowParked:
		done = "parked (its key is held)"
	}
	reason := fmt.Sprintf("message id %s was already %s with payload sha256 %x; this delivery has sha256 %x", d.id, done, prior, d.sum)
	if failed != "" {
		reason += "; its handler had failed: " + failed
	}
	if err := in.insertQuarantine(ctx, tx, d, KindPayloadConflict, reason, prior); err != nil {
		return "", "", err
	}
	return Conflict, reason, nil
}

// recordCopy notes another copy of d's message on its inbox row, adding dup
// to its duplicates: the row stays while Kafka holds any copy this consumer
// saw (Config.LogStart), so it keeps the highest offset, or -1 for the
// partition when copies came on several partitions, of one topic or of two
// (a redrive's copy on Config.RedriveTopic): swept by age alone.
// The count stops at the int column's maximum: a counter that overflowed
// would fail the statement and send the copy back forever.
//
// In a partitioned inbox it also takes back every consumer's clearance of
// the row's partition (partition.go): the copy's offset may be one Kafka
// still holds, so the partition's rows must be judged again before it goes.
func (in *Inbox) recordCopy(ctx context.Context, tx pgx.Tx, d *delivery, dup int) error {
	update := `
		UPDATE inbox_messages SET duplicates = least(duplicates::bigint + $5, 2147483647),
			kafka_partition = CASE WHEN $3::int IS NULL OR kafka_partition IS NULL OR kafka_partition = $3 AND topic = $6 THEN kafka_partition ELSE -1 END,
			kafka_offset = CASE WHEN $3::int IS NOT NULL AND kafka_partition = $3 AND topic = $6 THEN greatest(kafka_offset, $4::bigint) ELSE kafka_offset END
		WHERE consumer = $1 AND message_id = $2` + in.rowTime(d.id, 7)
	if in.cfg.Partitions != nil {
		update = `WITH u AS (` + update + ` RETURNING tableoid)
			DELETE FROM inbox_partitions_cleared pc USING u, pg_class c WHERE c.oid = u.tableoid AND pc.partition = c.relname::text`
	}
	_, err := tx.Exec(ctx, update, in.rowArgs(d.id, in.cfg.Consumer, d.id, d.part, d.offset, dup, d.logTopic())...)
	return err
}

// rowTime is the condition that prunes a statement finding an inbox row by
// (consumer, message id) to the partitions it can be in, its id's time
// being parameter n: the partition of that time, and the one of rows
// written without a time. "" in a plain inbox.
func (in *Inbox) rowTime(id string, n int) string {
	if in.cfg.Partitions == nil {
		return ""
	}
	return fmt.Sprintf(" AND msg_time IN ($%d, '-infinity')", n)
}

// rowArgs is the arguments of a statement finding id's inbox row: args
// followed, in a partitioned inbox, by the time of id, for rowTime's
// parameter, the statement planned at each call (schema.PlanEachTime). An id
// without a time (quarantined before any row is written) gets a time no
// row has.
func (in *Inbox) rowArgs(id string, args ...any) []any {
	args = append([]any{schema.PlanEachTime}, args...)
	if in.cfg.Partitions == nil {
		return args
	}
	t, err := in.cfg.Partitions.Time(id)
	if err != nil {
		return append(args, pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true})
	}
	return append(args, t)
}

// insertQuarantine records d as it arrived: a record with no value (a nil
// payload) as a NULL payload, and its headers exactly in raw_metadata when
// metadata had to change any of them to store them as text.
func (in *Inbox) insertQuarantine(ctx context.Context, tx pgx.Tx, d *delivery, kind, reason string, prior []byte) error {
	meta, err := metadataJSON(d.msg.Metadata)
	if err != nil {
		return err
	}
	raw, err := rawMetadataJSON(d.msg.Metadata)
	if err != nil {
		return err
	}
	onConflict := "ON CONFLICT (consumer, kind, message_id, payload_sha256) WHERE kind <> 'dead_letter' DO NOTHING"
	if kind == KindDeadLetter {
		onConflict = ""
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO inbox_quarantine (consumer, message_id, kind, reason, attempts, topic, payload_sha256, original_sha256, payload, metadata, raw_metadata)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) `+onConflict,
		in.cfg.Consumer, d.id, kind, schema.Text(reason), d.attempts, d.topic, d.sum[:], prior, d.msg.Payload, meta, raw)
	if err != nil {
		return fmt.Errorf("inbox: recording %s: %w", kind, err)
	}
	return nil
}

// metadataJSON encodes metadata as a jsonb column takes it.
func metadataJSON(md message.Metadata) ([]byte, error) {
	clean := make(map[string]string, len(md))
	for k, v := range md {
		clean[schema.Text(k)] = schema.Text(v)
	}
	meta, err := json.Marshal(clean)
	if err != nil {
		return nil, fmt.Errorf("inbox: encoding metadata: %w", err)
	}
	return meta, nil
}

// rawMetadataJSON returns md with every name and value in standard base64,
// as inbox_quarantine's raw_metadata keeps it, or nil when metadataJSON
// keeps md exactly (every entry text Postgres can hold).
func rawMetadataJSON(md message.Metadata) ([]byte, error) {
	exact := true
	for k, v := range md {
		exact = exact && k == schema.Text(k) && v == schema.Text(v)
	}
	if exact {
		return nil, nil
	}
	raw := make(map[string]string, len(md))
	for k, v := range md {
		raw[base64.StdEncoding.EncodeToString([]byte(k))] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	out, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("inbox: encoding raw metadata: %w", err)
	}
	return out, nil
}

func (s skipKey) batchable(_ context.Context, _ pgx.Tx, items []*batchItem, _ []batchResult) ([]int, error) {
	live := make([]int, len(items))
	for i := range live {
		live[i] = i
	}
	return live, nil
}

func (s skipKey) afterCommit(*delivery, applier) error { return nil }
