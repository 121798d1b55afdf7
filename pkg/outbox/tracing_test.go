package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestPublishTxStampsMetadata checks what PublishTx adds to a row's metadata:
// the write time always, the trace context of ctx when the application set
// a propagator. The subtests run in order: the last one sets the global
// propagator.
func TestPublishTxStampsMetadata(t *testing.T) {
	t.Parallel()
	pool, topic := newPool(t), newTopic(t)
	ctx := t.Context()
	span := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		TraceFlags: trace.FlagsSampled,
	})
	inSpan := trace.ContextWithSpanContext(ctx, span)
	const want = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

	// write publishes msg from ctx and returns the row's metadata.
	write := func(t *testing.T, ctx context.Context, msg *message.Message) message.Metadata {
		t.Helper()
		before := time.Now()
		publishCommittedFrom(t, ctx, pool, topic, msg)
		var meta message.Metadata
		require.NoError(t, pool.QueryRow(ctx, `SELECT metadata FROM outbox_messages WHERE message_id = $1`, msg.UUID).Scan(&meta))
		created, ok := outbox.CreatedAt(&message.Message{Metadata: meta})
		require.True(t, ok, "no %s in %v", outbox.CreatedAtMetadata, meta)
		require.WithinDuration(t, before, created, 5*time.Second)
		return meta
	}

	t.Run("NoPropagatorNoTraceparent", func(t *testing.T) {
		msg := outbox.NewMessage("k", []byte("1"))
		meta := write(t, inSpan, msg)
		require.Empty(t, meta.Get(outbox.TraceparentMetadata), "the global propagator is a no-op until the application sets one")
		require.Empty(t, msg.Metadata.Get(outbox.CreatedAtMetadata), "the caller's message is left as it was")
	})

	t.Run("TraceparentFromContext", func(t *testing.T) {
		otel.SetTextMapPropagator(propagation.TraceContext{})
		t.Cleanup(func() { otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator()) })

		meta := write(t, inSpan, outbox.NewMessage("k", []byte("2")))
		require.Equal(t, want, meta.Get(outbox.TraceparentMetadata))

		// Written again from a context without a span (a redrive), a message
		// keeps the trace it belongs to, and gets a fresh write time.
		again := outbox.NewMessage("k", []byte("3"))
		again.Metadata.Set(outbox.TraceparentMetadata, want)
		again.Metadata.Set(outbox.CreatedAtMetadata, "2001-01-01T00:00:00Z")
		meta = write(t, ctx, again)
		require.Equal(t, want, meta.Get(outbox.TraceparentMetadata))
	})
}

// publishCommittedFrom writes msgs from ctx in a committed transaction.
func publishCommittedFrom(t *testing.T, ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, topic string, msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.PublishTx(ctx, tx, topic, msgs...)
	}))
}
