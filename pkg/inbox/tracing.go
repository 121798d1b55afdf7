package inbox

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// OutcomeAttribute is the span attribute that records how a delivery was
// settled: one of the Outcome values. A suppressed redelivery is its own
// short span with inbox.outcome=duplicate.
const OutcomeAttribute = "inbox.outcome"

// tracer follows the global TracerProvider, also one installed after this
// package was loaded. Without one, spans are no-ops that still carry the
// producer's trace context, so it propagates to the handler's outbox rows.
var tracer = otel.Tracer("github.com/outboxref/outbox-inbox/pkg/inbox")

// startSpan starts the span of one delivery, "inbox <consumer>", as a child
// of the trace context the producer stored in the message metadata (the
// traceparent that outbox.PublishTx adds; watermill-kafka turns Kafka headers
// into metadata), and puts it into the message context. The handler's
// transaction context derives from it, so the outbox rows the handler writes
// carry this span as their parent.
//
// The attributes are set only on a span that records, so a service without
// a TracerProvider (tracing off) does not build them for every delivery.
func (in *Inbox) startSpan(msg *message.Message) trace.Span {
	parent := otel.GetTextMapPropagator().Extract(msg.Context(), propagation.MapCarrier(msg.Metadata))
	ctx, span := tracer.Start(parent, in.spanName, consumerSpan)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", topicOf(msg)),
			attribute.String("messaging.message.id", msg.UUID),
			attribute.String("messaging.consumer.group.name", in.cfg.Consumer),
		)
	}
	msg.SetContext(ctx)
	return span
}

var consumerSpan = trace.WithSpanKind(trace.SpanKindConsumer)
