// Package dashboard serves a live page of the example system: orders by
// status, each service's outbox backlog and the age of its oldest pending
// row, the duplicates its inbox suppressed, the quarantined and dead-lettered
// messages with their reasons, and, during a chaos run, the kills per crash
// window and the invariants, read from a JSON status file.
//
// Everything on the page is read from the two services' databases (and the
// status file) with SQL, the way chaos/judge judges a run, so what it
// shows is what the databases hold. GET / renders the page with a plain Go
// template; GET /events streams the same template's live part as
// server-sent events every Interval; GET /snapshot.json is the data.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/audit"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"

	"github.com/outboxref/outbox-inbox/services/runtime/httpserve"
)

//go:embed page.html flow.js
var pageFS embed.FS

// Options configures a Server.
type Options struct {
	// Orders and Inventory are pools on the two services' databases. Required.
	Orders, Inventory *pgxpool.Pool
	// ChaosStatus is a JSON file a chaos run writes (chaos -status), or its
	// final -report; empty or missing: no chaos section.
	ChaosStatus string
	// Brokers, when set, are the Kafka brokers the page reads the topics'
	// partitions from: end offsets and the consumer groups' committed ones.
	Brokers []string
	// KafkaLogin is the page's own Kafka login, a principal that may read
	// offsets and nothing else (kafkainit.Grants("dashboard")); empty: the
	// process's (KAFKA_SASL_*, or a harness's kafkaconf.UseCredentials).
	KafkaLogin kafkaconf.Credentials
	// Crash, when set, adds "crash it now" to the page: the live demo's
	// lesson (dashboard/crashnow). cmd/dashboard never sets it.
	Crash Crasher
	// TraceURL, when set, links a journey's trace id to a tracing UI:
	// "{trace_id}" is replaced ("http://localhost:16686/trace/{trace_id}").
	TraceURL string
	// Audit, when set, is the auditor's database (services/auditor): the
	// page's "what is wrong now" panel lists its open findings.
	Audit *pgxpool.Pool
	// Interval is how often the live page updates. Defaults to 1s.
	Interval time.Duration
	// QueryTimeout bounds one snapshot's queries per database, so a database
	// restarting mid-chaos shows as unavailable instead of hanging the page.
	// Defaults to 2s.
	QueryTimeout time.Duration
}

// Server serves the page.
type Server struct {
	opts  Options
	tmpl  *template.Template
	kafka *offsets // nil without Options.Brokers

	// The latest snapshot, shared by every open page: one read of the
	// databases and Kafka per Interval, however many pages are open.
	snapMu sync.Mutex
	snap   Snapshot
}

// New checks opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Orders == nil || opts.Inventory == nil {
		return nil, errors.New("dashboard: Options.Orders and Options.Inventory are required")
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.QueryTimeout <= 0 {
		opts.QueryTimeout = 2 * time.Second
	}
	tmpl, err := template.New("page.html").Funcs(template.FuncMap{
		"seconds": func(s float64) string {
			if s < 10 {
				return fmt.Sprintf("%.1fs", s)
			}
			return (time.Duration(math.Round(s)) * time.Second).String()
		},
		"sorted": sortedKeys,
		"deref":  func(b *bool) bool { return b != nil && *b },
	}).ParseFS(pageFS, "page.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: parsing template: %w", err)
	}
	s := &Server{opts: opts, tmpl: tmpl}
	if len(opts.Brokers) > 0 {
		s.kafka = &offsets{brokers: opts.Brokers, login: opts.KafkaLogin}
	}
	return s, nil
}

// Snapshot is what the page shows at one moment.
type Snapshot struct {
	At          time.Time      `json:"at"`
	Orders      map[string]int `json:"orders"` // by status
	OrdersTotal int            `json:"orders_total"`
	Services    []Service      `json:"services"`
	Quarantine  []Quarantined  `json:"quarantine"` // open rows of both services, newest first
	Flow        Flow           `json:"flow"`
	Chaos       *ChaosStatus   `json:"chaos,omitempty"`
	Audit       *Audit         `json:"audit,omitempty"` // with Options.Audit
	Errors      []string       `json:"errors,omitempty"`
}

// Audit is what the auditor finds wrong now (pkg/audit's tables).
type Audit struct {
	Open      []AuditFinding `json:"open"` // the most recently seen first, at most auditShown
	OpenTotal int            `json:"open_total"`
	Checks    []AuditCheck   `json:"checks"`
}

// AuditFinding is one open finding.
type AuditFinding struct {
	Check  string  `json:"check"`
	Kind   string  `json:"kind"`
	Entity string  `json:"entity"` // an order's id, a SKU: shown as text
	Detail string  `json:"detail"`
	AgeS   float64 `json:"age_s"` // since first seen
}

// AuditCheck is one of the auditor's checks.
type AuditCheck struct {
	Name     string  `json:"name"`
	Examined int64   `json:"examined"`
	BehindS  float64 `json:"behind_s"` // since it last caught up; -1: never
}

// Service is one service's outbox and inbox, from its database.
type Service struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Database is what its database answers as: "primary", "read_only"
	// (a standby, or a primary a failover demoted) or "no_primary" (none
	// answers: failing over, or down).
	Database         string         `json:"database"`
	OutboxPending    int            `json:"outbox_pending"`
	OldestPendingAge float64        `json:"oldest_pending_age_s"`
	Applied          int            `json:"applied"`    // inbox rows of messages applied
	Duplicates       int64          `json:"duplicates"` // sum of inbox_messages.duplicates
	Quarantined      map[string]int `json:"quarantined"`
}

// Quarantined is one open (not redriven, not discarded) quarantine row.
type Quarantined struct {
	Service   string  `json:"service"`
	ID        int64   `json:"id"`
	Consumer  string  `json:"consumer"`
	Kind      string  `json:"kind"`
	MessageID string  `json:"message_id"`
	Reason    string  `json:"reason"`
	Attempts  int     `json:"attempts"`
	AgeS      float64 `json:"age_s"`
}

// ChaosStatus is the chaos harness's live status file, or its final report:
// the field names are those of chaos.Report, so either file can be shown.
type ChaosStatus struct {
	UpdatedAt        time.Time         `json:"updated_at"`
	Phase            string            `json:"phase"`
	Seed             uint64            `json:"seed"`
	Profile          string            `json:"profile"`
	Inbox            *bool             `json:"inbox"`
	OrdersPaid       int               `json:"orders_paid"`
	Kills            map[string]int    `json:"kills"` // crash window → SIGKILLs
	RandomKills      int               `json:"random_kills"`
	TotalKills       int               `json:"total_kills"`
	Restarts         int               `json:"restarts"`
	PostgresRestarts int               `json:"postgres_restarts"`
	BrokerFaults     map[string]int    `json:"broker_faults"`
	Invariants       map[string]bool   `json:"invariants"`
	Details          map[string]string `json:"details"`
	Passed           *bool             `json:"passed"` // unset while the run is going
}

// shared returns the latest snapshot when it is younger than half an
// Interval, else reads a new one; callers that arrive during a read wait
// for it instead of starting their own.
func (s *Server) shared(ctx context.Context) Snapshot {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if time.Since(s.snap.At) < s.opts.Interval/2 {
		return s.snap
	}
	s.snap = s.Snapshot(ctx)
	return s.snap
}

// Snapshot reads everything the page shows. A database that does not answer
// within QueryTimeout is marked unavailable and named in Errors.
func (s *Server) Snapshot(ctx context.Context) Snapshot {
	snap := Snapshot{At: time.Now(), Orders: map[string]int{}}
	for _, svc := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"orders", s.opts.Orders}, {"inventory", s.opts.Inventory}} {
		st, q, err := s.readService(ctx, svc.name, svc.pool, &snap)
		if err != nil {
			snap.Errors = append(snap.Errors, fmt.Sprintf("%s database: %v", svc.name, err))
		}
		snap.Services = append(snap.Services, st)
		snap.Quarantine = append(snap.Quarantine, q...)
	}
	sort.Slice(snap.Quarantine, func(i, j int) bool { return snap.Quarantine[i].AgeS < snap.Quarantine[j].AgeS })
	var flowErrs []string
	snap.Flow, flowErrs = s.readFlow(ctx)
	snap.Errors = append(snap.Errors, flowErrs...)
	if s.opts.Audit != nil {
		a, err := s.readAudit(ctx)
		if err != nil {
			snap.Errors = append(snap.Errors, "the auditor's database: "+err.Error())
		}
		snap.Audit = a
	}
	if s.opts.ChaosStatus != "" {
		c, err := readChaos(s.opts.ChaosStatus)
		if err != nil {
			snap.Errors = append(snap.Errors, "chaos status: "+err.Error())
		}
		snap.Chaos = c
	}
	return snap
}

// auditShown caps the open findings the page lists.
const auditShown = 15

// readAudit reads the auditor's open findings and its checks' state.
func (s *Server) readAudit(ctx context.Context) (*Audit, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	defer cancel()
	status, err := audit.ReadStatus(ctx, s.opts.Audit)
	if err != nil {
		return nil, err
	}
	recs, err := audit.ListFindings(ctx, s.opts.Audit, audit.ListOptions{Limit: auditShown})
	if err != nil {
		return nil, err
	}
	a := &Audit{Open: []AuditFinding{}}
	for _, st := range status {
		c := AuditCheck{Name: st.Check, Examined: st.Examined, BehindS: -1}
		if !st.CaughtUpAt.IsZero() {
			c.BehindS = max(time.Since(st.CaughtUpAt).Seconds(), 0)
		}
		a.Checks = append(a.Checks, c)
		for _, n := range st.Open {
			a.OpenTotal += n
		}
	}
	for _, r := range recs {
		a.Open = append(a.Open, AuditFinding{Check: r.Check, Kind: r.Kind, Entity: r.Entity, Detail: r.Detail,
			AgeS: max(time.Since(r.FirstSeen).Seconds(), 0)})
	}
	return a, nil
}

// quarantineShown caps the open quarantine rows listed per service.
const quarantineShown = 15

func (s *Server) readService(ctx context.Context, name string, pool *pgxpool.Pool, snap *Snapshot) (Service, []Quarantined, error) {
	st := Service{Name: name, Quarantined: map[string]int{}}
	ctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	defer cancel()
	var inRecovery bool
	err := pool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery)
	if st.Database = databaseState(err, inRecovery); st.Database == dbNoPrimary {
		return st, nil, fmt.Errorf("no primary database answers (failing over, or down): %w", err)
	}
	if name == "orders" {
		counts, err := countBy(ctx, pool, `SELECT status, count(*) FROM orders GROUP BY status`)
		if err != nil {
			return st, nil, err
		}
		for k, n := range counts {
			snap.Orders[k] = n
			snap.OrdersTotal += n
		}
	}
	err = pool.QueryRow(ctx, `
		SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM outbox_messages WHERE published_at IS NULL`).Scan(&st.OutboxPending, &st.OldestPendingAge)
	if err != nil {
		return st, nil, fmt.Errorf("reading outbox: %w", err)
	}
	st.OldestPendingAge = max(st.OldestPendingAge, 0)
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'processed'), coalesce(sum(duplicates), 0) FROM inbox_messages`).
		Scan(&st.Applied, &st.Duplicates); err != nil {
		return st, nil, fmt.Errorf("reading inbox: %w", err)
	}
	if st.Quarantined, err = countBy(ctx, pool, `SELECT kind, count(*) FROM inbox_quarantine WHERE resolved_at IS NULL GROUP BY kind`); err != nil {
		return st, nil, err
	}
	rows, err := pool.Query(ctx, `
		SELECT id, consumer, kind, message_id, reason, attempts, extract(epoch FROM now() - created_at)::float8
		FROM inbox_quarantine WHERE resolved_at IS NULL ORDER BY id DESC LIMIT $1`, quarantineShown)
	if err != nil {
		return st, nil, fmt.Errorf("reading quarantine: %w", err)
	}
	defer rows.Close()
	var list []Quarantined
	for rows.Next() {
		q := Quarantined{Service: name}
		if err := rows.Scan(&q.ID, &q.Consumer, &q.Kind, &q.MessageID, &q.Reason, &q.Attempts, &q.AgeS); err != nil {
			return st, nil, fmt.Errorf("reading quarantine: %w", err)
		}
		list = append(list, q)
	}
	if err := rows.Err(); err != nil {
		return st, nil, fmt.Errorf("reading quarantine: %w", err)
	}
	st.Available = true
	return st, list, nil
}

// What a service's database answers as (Service.Database).
const (
	dbPrimary   = "primary"
	dbReadOnly  = "read_only"
	dbNoPrimary = "no_primary"
)

// databaseState names what a database answered pg_is_in_recovery() with.
// The page reads a multi-host URL with target_session_attrs=read-write as
// the services do: while a failover runs, nothing answers it.
func databaseState(err error, inRecovery bool) string {
	switch {
	case err != nil:
		return dbNoPrimary
	case inRecovery:
		return dbReadOnly
	}
	return dbPrimary
}

func countBy(ctx context.Context, pool *pgxpool.Pool, sql string) (map[string]int, error) {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, rows.Err()
}

func readChaos(path string) (*ChaosStatus, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no chaos run (yet)
	}
	if err != nil {
		return nil, err
	}
	var c ChaosStatus
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err) // caught mid-write; the next tick reads it whole
	}
	return &c, nil
}

func sortedKeys(m any) []string {
	var keys []string
	switch m := m.(type) {
	case map[string]int:
		for k := range m {
			keys = append(keys, k)
		}
	case map[string]bool:
		for k := range m {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// statuses is the order in which the page lists order statuses.
var statuses = []string{"created", "paid", "reserved", "rejected"}

// view is what the template renders.
type view struct {
	Snapshot
	Statuses []string
}

func (s *Server) view(snap Snapshot) view {
	v := view{Snapshot: snap, Statuses: append([]string(nil), statuses...)}
	for _, k := range sortedKeys(snap.Orders) {
		if !contains(statuses, k) {
			v.Statuses = append(v.Statuses, k)
		}
	}
	return v
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Handler serves GET /, GET /events, GET /snapshot.json and GET /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := s.tmpl.Execute(&buf, s.view(s.shared(r.Context()))); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(buf.Bytes()) //nolint:errcheck // the client went away
	})
	mux.HandleFunc("GET /snapshot.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.shared(r.Context())) //nolint:errcheck
	})
	mux.HandleFunc("GET /events", s.events)
	mux.HandleFunc("GET /flow.js", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, pageFS, "flow.js")
	})
	s.journeyRoutes(mux) // journey.go
	s.crashRoutes(mux)   // crash.go
	// healthz answers 200 once both databases answer a query, for a
	// container's healthcheck; the page itself shows errors instead.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.opts.QueryTimeout)
		defer cancel()
		for name, pool := range map[string]*pgxpool.Pool{"orders": s.opts.Orders, "inventory": s.opts.Inventory} {
			if err := pool.Ping(ctx); err != nil {
				http.Error(w, name+" database: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// events streams the page's live part, rendered, as server-sent events.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	// The stream outlives the server's write timeout, which bounds every
	// other response.
	http.NewResponseController(w).SetWriteDeadline(time.Time{}) //nolint:errcheck
	tick := time.NewTicker(s.opts.Interval)
	defer tick.Stop()
	for {
		var buf bytes.Buffer
		snap := s.shared(r.Context())
		if err := s.tmpl.ExecuteTemplate(&buf, "live", s.view(snap)); err != nil {
			return
		}
		var ev strings.Builder
		ev.WriteString("event: live\n")
		for _, line := range strings.Split(buf.String(), "\n") {
			ev.WriteString("data: " + line + "\n")
		}
		ev.WriteString("\n")
		// The picture is drawn by the page's script from the data.
		picture, err := json.Marshal(s.picture(snap))
		if err != nil {
			return
		}
		ev.WriteString("event: flow\ndata: " + string(picture) + "\n\n")
		if _, err := w.Write([]byte(ev.String())); err != nil {
			return
		}
		flusher.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// Start serves the page on addr (":8090", "127.0.0.1:0") until ctx ends and
// returns its URL once it is listening.
func Start(ctx context.Context, addr string, opts Options) (string, error) {
	s, err := New(opts)
	if err != nil {
		return "", err
	}
	// Its one state-changing route, "crash it now" (make live), is served
	// on loopback only: the page's button sends no credential, so no token
	// could let it beyond. Without that route the page only reads.
	if opts.Crash != nil && !httpserve.Loopback(addr) {
		return "", fmt.Errorf("dashboard: %q is beyond loopback, and \"crash it now\" (which kills processes on this machine) is served on loopback only: listen on 127.0.0.1", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("dashboard: listening on %s: %w", addr, err)
	}
	// The event streams end with ctx, through the requests' base context.
	srv := httpserve.Server(addr, s.Handler(), httpserve.Options{}) // reads HTTP_ALLOWED_HOSTS
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	go srv.Serve(ln) //nolint:errcheck // ends with Close below
	go func() {
		<-ctx.Done()
		srv.Close() //nolint:errcheck
		if s.kafka != nil {
			s.kafka.close()
		}
	}()
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/", nil
}
