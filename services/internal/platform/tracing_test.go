package platform

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// traceOf returns the ended spans of trace id.
func traceOf(id trace.TraceID) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans.GetSpans() {
		if s.SpanContext.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == attribute.Key(key) {
			return kv.Value.Emit()
		}
	}
	return ""
}

// find returns the spans of list named name with inbox.outcome outcome
// ("" for any).
func find(list tracetest.SpanStubs, name, outcome string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range list {
		if s.Name == name && (outcome == "" || attr(s, inbox.OutcomeAttribute) == outcome) {
			out = append(out, s)
		}
	}
	return out
}

// TestTraceRoundTrip follows one payment through both services: the HTTP
// request, the outbox row written in its transaction, Kafka, the inventory
// inbox, inventory's outbox row, Kafka again and the orders inbox are one
// trace. A redelivery that the inbox suppresses is its own short span in
// that trace, marked as a duplicate.
func TestTraceRoundTrip(t *testing.T) {
	t.Parallel()
	p := setup(t)
	id := uuid.NewString()

	p.pay(t, id)
	eventually(t, p.ctx, func() bool { return p.status(t, id) == "reserved" }, "the order to be reserved")

	var root tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		if s.Name == "POST /pay/{id}" && attr(s, "url.path") == "/pay/"+id {
			root = s
		}
	}
	require.True(t, root.SpanContext.IsValid(), "no span for the HTTP request")
	require.False(t, root.Parent.IsValid(), "the request span is the root: the client sent no traceparent")
	require.Equal(t, trace.SpanKindServer, root.SpanKind)
	tid := root.SpanContext.TraceID()

	// The orders inbox span ends just after its commit, so once it is there
	// the whole round trip is.
	var invApplied, ordApplied tracetest.SpanStubs
	eventually(t, p.ctx, func() bool {
		ordApplied = find(spans.GetSpans(), "inbox "+p.orders, string(inbox.Applied))
		return len(ordApplied) == 1
	}, "the orders inbox span")
	require.Equal(t, tid, ordApplied[0].SpanContext.TraceID(), "the orders inbox span is not in the trace of the request")
	invApplied = find(traceOf(tid), "inbox "+p.inventory, string(inbox.Applied))
	require.Len(t, invApplied, 1, "spans of the trace: %v", names(traceOf(tid)))

	inv, ord := invApplied[0], ordApplied[0]
	require.Equal(t, root.SpanContext.SpanID(), inv.Parent.SpanID(), "inventory continues the trace of the HTTP request, through the outbox row and Kafka headers")
	require.True(t, inv.Parent.IsRemote())
	require.Equal(t, trace.SpanKindConsumer, inv.SpanKind)
	require.Equal(t, p.ordersTopic, attr(inv, "messaging.destination.name"))
	require.Equal(t, inv.SpanContext.SpanID(), ord.Parent.SpanID(), "orders continues the trace through inventory's outbox row")
	require.Equal(t, p.invTopic, attr(ord, "messaging.destination.name"))

	// The orders relay publishes OrderPaid again; the inventory inbox
	// suppresses it.
	p.republishOrderPaid(t, id)
	var dup tracetest.SpanStubs
	eventually(t, p.ctx, func() bool {
		dup = find(traceOf(tid), "inbox "+p.inventory, string(inbox.Duplicate))
		return len(dup) == 1
	}, "a duplicate span in the trace")
	d := dup[0]
	require.Equal(t, root.SpanContext.SpanID(), d.Parent.SpanID(), "the redelivery carries the same traceparent")
	require.NotEqual(t, inv.SpanContext.SpanID(), d.SpanContext.SpanID(), "a span of its own")
	took := d.EndTime.Sub(d.StartTime)
	require.Less(t, took, time.Second, "a suppressed duplicate is a short span")
	for _, s := range traceOf(tid) {
		require.NotEqual(t, d.SpanContext.SpanID(), s.Parent.SpanID(), "a duplicate has no children: nothing was published (%s)", s.Name)
	}
	require.Equal(t, 1, p.duplicates(t))
	require.Len(t, find(traceOf(tid), "inbox "+p.orders, ""), 1, "orders heard once")
	t.Logf("trace %s: %v; duplicate took %v", tid, names(traceOf(tid)), took)
}

func names(list tracetest.SpanStubs) []string {
	var out []string
	for _, s := range list {
		out = append(out, s.Name+"["+attr(s, inbox.OutcomeAttribute)+"]")
	}
	return out
}

func TestTracingMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tracing, endpoint, want string
	}{
		{"", "", "off"},
		{"", "http://collector:4318", "otlp"},
		{"off", "http://collector:4318", "off"},
		{"otlp", "", "otlp"},
	} {
		got, err := tracingMode(Config{Tracing: tc.tracing, OTLPEndpoint: tc.endpoint})
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "TRACING=%q OTEL_EXPORTER_OTLP_ENDPOINT=%q", tc.tracing, tc.endpoint)
	}
	_, err := tracingMode(Config{Tracing: "jaeger"})
	require.ErrorContains(t, err, "want off or otlp")
}
