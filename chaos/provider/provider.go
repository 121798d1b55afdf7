package provider

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate applies the provider's tables (migrations/) to its database.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return err
	}
	return migrate.Apply(ctx, pool, "provider", sub)
}

// Provider is the payment provider stand-in: its HTTP API (Handler) over
// its ledger, and the faults it injects.
type Provider struct {
	pool    *pgxpool.Pool
	standby *standby.Gate // Config.DatabaseStandbys, or nil
	cfg     Config
	log     *slog.Logger

	mu   sync.Mutex // guards rng
	rng  *mrand.Rand
	seed uint64

	stopping     chan struct{} // closed when Run shuts down
	stoppingOnce sync.Once
}

// New returns a provider on pool, whose database Migrate has prepared.
func New(pool *pgxpool.Pool, cfg Config) (*Provider, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	seed := cfg.Seed
	for seed == 0 {
		var b [8]byte
		rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read does not fail
		seed = binary.LittleEndian.Uint64(b[:])
	}
	p := &Provider{
		pool: pool, cfg: cfg, log: cfg.Logger, seed: seed, stopping: make(chan struct{}),
		rng: mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
	if cfg.DatabaseStandbys > 0 {
		gate, err := standby.New(standby.Config{Pool: pool, Standbys: int(cfg.DatabaseStandbys), Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("PROVIDER_DATABASE_STANDBYS: %w", err)
		}
		p.standby = gate
	}
	return p, nil
}

// stop ends the silences of lost responses (LostResponseDelay), so that a
// shutdown does not wait them out.
func (p *Provider) stop() { p.stoppingOnce.Do(func() { close(p.stopping) }) }

// Seed returns the seed of the provider's faults (Config.Seed, or the one
// picked for it).
func (p *Provider) Seed() uint64 { return p.seed }

// fate is what the faults hold for one POST, drawn when it arrives, in the
// order POSTs arrive, so that a seed repeats a run's faults.
type fate struct {
	fail    bool          // 500 before anything is done
	latency time.Duration // spent while holding the key
	lost    bool          // executed, committed, never answered
}

func (p *Provider) draw() fate {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := fate{fail: p.rng.Float64() < p.cfg.FailRate, latency: p.cfg.LatencyMin}
	if span := p.cfg.LatencyMax - p.cfg.LatencyMin; span > 0 {
		f.latency += time.Duration(p.rng.Int64N(int64(span) + 1))
	}
	f.lost = p.rng.Float64() < p.cfg.LostResponseRate
	return f
}

// Capture is a ledger entry: what POST /v1/captures answers (200, or
// inside the 402's error), and what the GET endpoints list.
type Capture struct {
	ID             string `json:"id"`
	Object         string `json:"object"` // "capture"
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	Reference      string `json:"reference"`
	Source         string `json:"source"`
	Status         string `json:"status"` // captured or declined
	DeclineCode    string `json:"decline_code,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Created        int64  `json:"created"` // Unix seconds
}

// Capture statuses.
const (
	StatusCaptured = "captured"
	StatusDeclined = "declined"
)

// APIError is the body of every error response, shaped like Stripe's:
// {"error": {"type": …, "code": …, "message": …}}.
type APIError struct {
	Type        string   `json:"type"` // invalid_request_error, idempotency_error, card_error, api_error
	Code        string   `json:"code,omitempty"`
	DeclineCode string   `json:"decline_code,omitempty"`
	Param       string   `json:"param,omitempty"`
	Message     string   `json:"message"`
	Capture     *Capture `json:"capture,omitempty"` // the declined attempt
}

// ErrorBody wraps an APIError as it is sent.
type ErrorBody struct {
	Error APIError `json:"error"`
}

// List is what the GET endpoints answer.
type List struct {
	Object  string    `json:"object"` // "list"
	Data    []Capture `json:"data"`
	HasMore bool      `json:"has_more"`
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("provider: marshal %T: %v", v, err)) // only our own types come here
	}
	return append(b, '\n')
}

// newID returns prefix and 26 random characters (128 bits).
func newID(prefix string) string { return prefix + strings.ToLower(rand.Text()) }
