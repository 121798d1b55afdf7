package outbox_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestPublishTxNumbersEachKey: each keyed message carries its place in its
// key's history as the relay publishes it (SequenceMetadata): the keys of
// one transaction numbered apart, in the order given, the next transaction
// going on where the last stopped, all under the outbox's one stream. A
// number the caller's message carries is replaced; a message without a key,
// or written Unordered or Unnumbered (a redriven copy), carries none and
// takes no number.
func TestPublishTxNumbersEachKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, topic := newPool(t), newTopic(t)
	sink := newSink(t, topic)

	stale := newKeyedMessage("a", 5)
	stale.Metadata.Set(outbox.SequenceMetadata, "0190a7c4-0000-4000-8000-00000000000a:99") // copied from a consumed message
	unkeyed := newKeyedMessage("", 6)
	unordered := newKeyedMessage("a", 8)
	unordered.Metadata.Set(outbox.SequenceMetadata, "0190a7c4-0000-4000-8000-00000000000a:99")
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.PublishTx(ctx, tx, topic, newKeyedMessage("a", 1), newKeyedMessage("b", 2), newKeyedMessage("a", 3), unkeyed, stale)
	}))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.PublishTx(ctx, tx, topic, newKeyedMessage("a", 7))
	}))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Writer{Unordered: true}.PublishTx(ctx, tx, topic, unordered)
	}))
	redriven := newKeyedMessage("a", 9) // a copy another outbox numbered
	redriven.Metadata.Set(outbox.SequenceMetadata, "0190a7c4-0000-4000-8000-00000000000a:3")
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := (outbox.Writer{Unnumbered: true}).PublishTx(ctx, tx, topic, redriven); err != nil {
			return err
		}
		return outbox.PublishTx(ctx, tx, topic, newKeyedMessage("a", 10))
	}))

	startRelay(t, newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: newPublisher(t)}))
	eventually(t, waitTimeout, func() bool { return len(sink.Records()) >= 9 })

	got := map[int]*keyNumber{} // by the payload's seq
	for _, r := range sink.Records() {
		var p payload
		require.NoError(t, json.Unmarshal(r.Value, &p))
		got[p.Seq] = sequenceOf(t, r)
	}
	require.Len(t, got, 9)
	for _, seq := range []int{6, 8, 9} {
		require.Nil(t, got[seq], "message %d carries a number", seq)
	}
	var stream string
	require.NoError(t, pool.QueryRow(ctx, `SELECT id::text FROM outbox_stream`).Scan(&stream))
	for seq, want := range map[int]*keyNumber{1: {stream, 1}, 3: {stream, 2}, 5: {stream, 3}, 7: {stream, 4}, 10: {stream, 5}, 2: {stream, 1}} {
		require.Equal(t, want, got[seq], "message %d", seq)
	}
}

// keyNumber is a message's place in its key's history.
type keyNumber struct {
	stream string
	n      int
}

// sequenceOf reads r's SequenceMetadata header, or nil when it has none.
func sequenceOf(t *testing.T, r *kgo.Record) *keyNumber {
	t.Helper()
	for _, h := range r.Headers {
		if h.Key != outbox.SequenceMetadata {
			continue
		}
		stream, n, ok := strings.Cut(string(h.Value), ":")
		require.True(t, ok, "header %q", h.Value)
		num, err := strconv.Atoi(n)
		require.NoError(t, err)
		return &keyNumber{stream, num}
	}
	return nil
}
