package outbox

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// CreatedAtMetadata is the metadata key PublishTx stamps on every row: the
// time the message was written to the outbox (RFC 3339, nanoseconds), just
// before the producer's transaction commits. A consumer subtracts it from
// the time it applied the message to measure commit-to-apply latency (see
// CreatedAt). PublishTx overwrites it, so a message written again (a
// redrive) is stamped with the time of that write.
const CreatedAtMetadata = "outbox_created_at"

// TraceparentMetadata is the metadata key that carries the W3C trace context
// of the transaction that wrote the row, when the application installed an
// OpenTelemetry propagator (otel.SetTextMapPropagator) and ctx holds a span.
// The relay publishes metadata as Kafka headers, so the consumer can continue
// the trace. Without a propagator nothing is added, and a message written
// again from a context without a span keeps the trace context it had.
const TraceparentMetadata = "traceparent"

// CreatedAt returns the CreatedAtMetadata time of msg, if it has one.
func CreatedAt(msg *message.Message) (time.Time, bool) {
	raw := msg.Metadata.Get(CreatedAtMetadata)
	if raw == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, raw)
	return t, err == nil
}

// stampedMetadata returns a copy of meta with the write time and the trace
// context of ctx added, for the outbox row. The caller's message is left
// as it was.
func stampedMetadata(ctx context.Context, meta message.Metadata) message.Metadata {
	out := make(message.Metadata, len(meta)+2)
	for k, v := range meta {
		out[k] = v
	}
	out[CreatedAtMetadata] = time.Now().UTC().Format(time.RFC3339Nano)
	// The global propagator is a no-op until the application sets one; the
	// W3C propagator writes nothing when ctx has no valid span.
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(out))
	return out
}
