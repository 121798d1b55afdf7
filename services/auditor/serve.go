package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/services/runtime/httpserve"
	"github.com/outboxref/outbox-inbox/services/runtime/pgconnect"
)

// kinds lists each check's kinds of finding: their open count is exported
// as 0 too, so an alert that fired resolves when its series drops to 0.
var kinds = map[string][]string{
	"orders":    {KindUnanswered, KindAnswerUnapplied, KindAnswerWithoutDecide, KindAnswersDisagree, KindWrongQuantities, KindCapturePending, KindSaleMissing, KindWrongSale, KindUnreadable},
	"decisions": {KindDecisionWithoutOrder, KindDecisionWithoutPayment},
	"sales":     {KindSaleWithoutCapture},
	"refunds":   {KindRefundPending, KindRefundFailed},
	"stock":     {KindStockOutOfBalance},
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if level != "" {
		if err := l.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("LOG_LEVEL=%q: %w", level, err)
		}
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})).With("service", "auditor"), nil
}

// serve runs the auditor until ctx ends.
func serve(ctx context.Context, cfg config) error {
	log, err := newLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	pools := map[string]*pgxpool.Pool{}
	for name, url := range map[string]string{"orders": cfg.OrdersURL, "inventory": cfg.InventoryURL, "audit": cfg.AuditURL} {
		p, err := pgconnect.Open(ctx, url, log.With("database", name))
		if err != nil {
			return fmt.Errorf("%s database: %w", name, err)
		}
		defer p.Close()
		pools[name] = p
	}
	if err := migrateState(ctx, pools["audit"]); err != nil {
		return err
	}
	a, err := audit.New(pools["audit"], audit.Config{Grace: cfg.Grace, Interval: cfg.Interval, Batch: cfg.Batch, Logger: log},
		domain{orders: pools["orders"], inventory: pools["inventory"], grace: cfg.Grace, repair: newOrdersAPI(cfg.OrdersAPI, cfg.OrdersToken)}.checks()...)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.HTTPAddr, err)
	}
	srv := httpserve.Server(cfg.HTTPAddr, handler(pools["audit"], log), httpserve.Options{})

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	g.Go(func() error { return a.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	})
	if cfg.OrdersAPI == "" {
		log.Warn("ORDERS_API_URL is unset: findings are reported, none is repaired (a capture inventory rejected is not refunded)")
	}
	log.Info("started", "http", ln.Addr().String(), "grace", cfg.Grace, "interval", cfg.Interval, "batch", cfg.Batch, "repairs", cfg.OrdersAPI != "")
	err = g.Wait()
	log.Info("stopped", "err", err)
	return err
}

// migrateState creates the auditor's tables: pkg/audit's and the stock
// ledger.
func migrateState(ctx context.Context, pool *pgxpool.Pool) error {
	if err := audit.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	if err := migrate.Apply(ctx, pool, "auditor", migrations); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	return nil
}

// handler serves GET /findings (?all=1 resolved ones too, ?check=, ?limit=),
// GET /status, GET /metrics, and GET /healthz and /readyz (its database
// answers).
func handler(state *pgxpool.Pool, log *slog.Logger) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{state: state, log: log})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	health := func(w http.ResponseWriter, r *http.Request) {
		if err := state.Ping(r.Context()); err != nil {
			httpserve.Refuse(w, http.StatusServiceUnavailable, "the auditor's database: "+err.Error())
			return
		}
		writeJSON(w, map[string]string{"status": "ok"})
	}
	mux.HandleFunc("GET /healthz", health)
	mux.HandleFunc("GET /readyz", health)
	mux.HandleFunc("GET /findings", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit := 100
		if raw := q.Get("limit"); raw != "" {
			n, err := strconv.Atoi(raw)
			if err != nil || n < 1 || n > 10_000 {
				httpserve.Refuse(w, http.StatusBadRequest, "limit: want a number from 1 to 10000")
				return
			}
			limit = n
		}
		if c := q.Get("check"); c != "" && kinds[c] == nil {
			httpserve.Refuse(w, http.StatusBadRequest, "check: one of orders, decisions, sales, stock")
			return
		}
		recs, err := audit.ListFindings(r.Context(), state, audit.ListOptions{Check: q.Get("check"), All: q.Get("all") == "1", Limit: limit})
		if err != nil {
			httpserve.Refuse(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		out := make([]findingJSON, len(recs))
		for i, rec := range recs {
			out[i] = toJSON(rec)
		}
		writeJSON(w, map[string]any{"findings": out})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		st, err := audit.ReadStatus(r.Context(), state)
		if err != nil {
			httpserve.Refuse(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		writeJSON(w, map[string]any{"checks": st})
	})
	return mux
}

// findingJSON is one finding as GET /findings answers it.
type findingJSON struct {
	Check      string     `json:"check"`
	Entity     string     `json:"entity"`
	Kind       string     `json:"kind"`
	Detail     string     `json:"detail"`
	FirstSeen  time.Time  `json:"first_seen"`
	LastSeen   time.Time  `json:"last_seen"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	Raised     int        `json:"raised"`
	// What the auditor's repair did about it, and when; or why its last
	// attempt failed (repair.go).
	Repair      string     `json:"repair,omitempty"`
	RepairedAt  *time.Time `json:"repaired_at,omitempty"`
	RepairError string     `json:"repair_error,omitempty"`
}

func toJSON(r audit.Record) findingJSON {
	f := findingJSON{Check: r.Check, Entity: r.Entity, Kind: r.Kind, Detail: r.Detail, FirstSeen: r.FirstSeen, LastSeen: r.LastSeen, Raised: r.Raised}
	if !r.Open() {
		f.ResolvedAt = &r.ResolvedAt
	}
	f.Repair, f.RepairError = r.Repair, r.RepairError
	if !r.RepairedAt.IsZero() {
		f.RepairedAt = &r.RepairedAt
	}
	return f
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}

// The metrics: read from the auditor's database at each scrape, so every
// replica exports the same numbers (alerts take max, not sum).
var (
	openDesc = prometheus.NewDesc("audit_findings_open",
		"Findings of the auditor that still hold (audit_findings; GET /findings), by check and kind: each is a breach of an invariant on the live system, named with its order or SKU.",
		[]string{"check", "kind"}, nil)
	examinedDesc = prometheus.NewDesc("audit_examined_total",
		"Entities (orders, decisions, sales, reservation and fulfilment rows) the check has examined past its watermark.",
		[]string{"check"}, nil)
	behindDesc = prometheus.NewDesc("audit_behind_seconds",
		"Seconds since the check last caught up with its grace period (since the auditor started, if it never has): a check that cannot keep up, or cannot read, grows it.",
		[]string{"check"}, nil)
)

type collector struct {
	state *pgxpool.Pool
	log   *slog.Logger
}

var started = time.Now()

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- openDesc
	ch <- examinedDesc
	ch <- behindDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	status, err := audit.ReadStatus(ctx, c.state)
	if err != nil {
		c.log.Warn("metrics: reading the audit status", "err", err)
		return
	}
	byCheck := map[string]audit.Status{}
	for _, s := range status {
		byCheck[s.Check] = s
	}
	for check, ks := range kinds {
		s := byCheck[check]
		for kind := range s.Open {
			if !slices.Contains(ks, kind) {
				ks = append(ks, kind)
			}
		}
		for _, kind := range ks {
			ch <- prometheus.MustNewConstMetric(openDesc, prometheus.GaugeValue, float64(s.Open[kind]), check, kind)
		}
		ch <- prometheus.MustNewConstMetric(examinedDesc, prometheus.CounterValue, float64(s.Examined), check)
		since := s.CaughtUpAt
		if since.IsZero() {
			since = started
		}
		ch <- prometheus.MustNewConstMetric(behindDesc, prometheus.GaugeValue, time.Since(since).Seconds(), check)
	}
}
