package platform

import (
	"context"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracingMode resolves Config.Tracing: "otlp" or "off"; empty means otlp
// when OTEL_EXPORTER_OTLP_ENDPOINT is set, off otherwise.
func tracingMode(cfg Config) (string, error) {
	switch cfg.Tracing {
	case "":
		if cfg.OTLPEndpoint != "" {
			return "otlp", nil
		}
		return "off", nil
	case "off", "otlp":
		return cfg.Tracing, nil
	default:
		return "", fmt.Errorf("TRACING=%q: want off or otlp", cfg.Tracing)
	}
}

// setupTracing installs the global TracerProvider and the W3C trace-context
// propagator when tracing is on, so that the HTTP span, the outbox rows
// (traceparent metadata), Kafka headers and the inbox spans form one trace.
// Off (the default) it installs nothing: no span is recorded and no
// traceparent is written. The returned function flushes and stops the
// exporter.
func setupTracing(ctx context.Context, cfg Config, service string) (func(context.Context) error, error) {
	mode, err := tracingMode(cfg)
	if err != nil || mode == "off" {
		return func(context.Context) error { return nil }, err
	}
	// The exporter reads OTEL_EXPORTER_OTLP_ENDPOINT (default
	// http://localhost:4318) and the other OTEL_EXPORTER_OTLP_* variables.
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("creating OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", service),
		attribute.String("service.instance.id", cfg.Instance),
	))
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	// The sampler follows OTEL_TRACES_SAMPLER; by default every trace that
	// starts here is kept, and a continued trace keeps its parent's decision.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}

var httpTracer = otel.Tracer("github.com/outboxref/outbox-inbox/services/internal/platform")

// traceHTTP starts a server span per API request, continuing a traceparent
// the client sent. The span is in the request context, so an outbox row the
// handler writes carries it. Health and metrics endpoints are not traced.
func traceHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			next.ServeHTTP(w, r)
			return
		}
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := httpTracer.Start(ctx, r.Method, serverSpan)
		defer span.End()
		if !span.IsRecording() { // tracing off: the context still carries the caller's trace
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		span.SetAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path))
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		r = r.WithContext(ctx)
		next.ServeHTTP(sw, r)
		if r.Pattern != "" { // set by the ServeMux that routed r, e.g. "POST /orders/{id}/pay"
			span.SetName(r.Pattern)
			span.SetAttributes(attribute.String("http.route", r.Pattern))
		}
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

var serverSpan = trace.WithSpanKind(trace.SpanKindServer)

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
