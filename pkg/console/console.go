// Package console is a web console for a consumer's inbox: the failure
// groups of its quarantined messages, their messages a page at a time, one
// message whole (payload and headers as text), bulk retries and drops
// with a dry run confirmed before anything is done, the history of what
// operators did, and held keys and parked outbox rows. It is pkg/inbox's
// admin API (groups.go, bulk.go, admin.go) in a browser: the same
// implementation inboxctl runs.
//
// Closed by default: with no logins (Config.Users) it answers loopback
// clients only, as the operator "loopback"; with logins, every request
// needs one (HTTP basic auth, or "Authorization: Bearer <secret>"), viewers
// read and operators act, and every action is recorded with its user's
// name. Every form carries a token bound to its user (CSRF), and a
// cross-site post is refused. Whatever a message holds (payloads, ids,
// headers, reasons, SKUs) is shown as text, never as markup: the pages are
// html/template's, and they run no script at all (Content-Security-Policy
// script-src 'none').
//
// A bulk action runs in [Console.Run], not in the request that started it:
// the page shows its progress and a Stop button (inboxadmin.Admin.StopBulk); a
// console killed half-way resumes its running actions when it runs again
// (and those inboxctl left cut off), and each message is done once
// (inboxadmin.Admin.RunBulk).
//
// Mounted in a server of your own, give it what the services' server
// gives it (services/runtime/httpserve): timeouts, and a check of the Host
// header against the names it is served under. Loopback mode checks its
// own.
package console

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

// Config configures a Console.
type Config struct {
	// Pool is the consumer's database. Required.
	Pool *pgxpool.Pool
	// Title names the console on its pages (the service). Defaults to
	// "inbox".
	Title string
	// Users are the logins. None: loopback clients only.
	Users []User
	// Key signs the forms' CSRF tokens. Defaults to 32 random bytes: the
	// forms of a restarted console must be reloaded, and replicas behind
	// one address need one Key (the services' CONSOLE_KEY).
	Key []byte
	// PageSize is how many messages a page shows. Defaults to 50.
	PageSize int
	// BatchSize is how many messages one transaction of a bulk action does.
	// Defaults to 100.
	BatchSize int
	// Logger logs every action. nil: discarded.
	Logger *slog.Logger
}

// Console serves the pages (ServeHTTP) and runs the bulk actions (Run).
type Console struct {
	cfg    Config
	inbox  *inboxadmin.Admin  // the consumer's dead letters, held keys and bulk actions
	outbox *outboxadmin.Admin // the relay's parked rows
	key    []byte
	mux    *http.ServeMux
	cross  *http.CrossOriginProtection
	wake   chan struct{}

	mu      sync.Mutex
	running bool
	retryAt map[int64]time.Time // Run's: when an action that failed is tried again
}

// New returns a Console for cfg.
func New(cfg Config) (*Console, error) {
	if cfg.Pool == nil {
		return nil, errors.New("console: Config.Pool is required")
	}
	if err := checkUsers(cfg.Users); err != nil {
		return nil, err
	}
	if cfg.Title == "" {
		cfg.Title = "inbox"
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Console{cfg: cfg, inbox: inboxadmin.New(cfg.Pool), outbox: outboxadmin.New(cfg.Pool), key: cfg.Key, cross: http.NewCrossOriginProtection(), wake: make(chan struct{}, 1), retryAt: map[int64]time.Time{}}
	if len(c.key) == 0 {
		c.key = make([]byte, 32)
		if _, err := rand.Read(c.key); err != nil {
			return nil, fmt.Errorf("console: a CSRF key: %w", err)
		}
	}
	c.routes()
	return c, nil
}

// ServeHTTP answers a request for the console's pages: its user's, or a
// refusal (401 without a login, 403 for a viewer's action or a forged form).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	u, ok := c.who(r)
	if !ok {
		if len(c.cfg.Users) == 0 {
			c.refuse(w, r, http.StatusForbidden, "this console has no logins (CONSOLE_USERS) and answers loopback clients only, by a loopback name, not forwarded by a proxy")
			return
		}
		h.Set("WWW-Authenticate", `Basic realm="console", charset="UTF-8"`)
		c.refuse(w, r, http.StatusUnauthorized, "log in: this console needs a login")
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), userKey{}, u))
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost:
		if err := c.cross.Check(r); err != nil {
			c.refuse(w, r, http.StatusForbidden, "cross-site request refused: an action must come from the console's own pages")
			return
		}
		if u.Role != Operator {
			c.refuse(w, r, http.StatusForbidden, u.Name+" is a viewer: only an operator may act")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			c.refuse(w, r, http.StatusBadRequest, "the form could not be read: "+err.Error())
			return
		}
		if err := c.checkForm(r, u); err != nil {
			c.refuse(w, r, http.StatusForbidden, err.Error())
			return
		}
	default:
		h.Set("Allow", "GET, HEAD, POST")
		c.refuse(w, r, http.StatusMethodNotAllowed, "the console takes GET and POST only")
		return
	}
	c.mux.ServeHTTP(w, r)
}

type userKey struct{}

func userOf(r *http.Request) User { u, _ := r.Context().Value(userKey{}).(User); return u }

// Run does the bulk actions started from the pages, and resumes those a
// stopped console left running, until ctx ends; then it returns nil. An
// action stopped by ctx stays running, to be resumed by the next Run.
func (c *Console) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errors.New("console: Run is running already")
	}
	c.running = true
	c.mu.Unlock()
	defer func() { c.mu.Lock(); c.running = false; c.mu.Unlock() }()
	for {
		c.runActions(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-time.After(30 * time.Second): // an action another replica started and left
		}
	}
}

// runActions runs the running actions, oldest first, each to its end or to
// an error; one that failed is tried again a minute later, the others not
// held up behind it.
func (c *Console) runActions(ctx context.Context) {
	list, err := c.inbox.ListActions(ctx, inboxadmin.ActionFilter{Running: true, Limit: 100})
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.Error("console: listing running actions", "error", err)
		}
		return
	}
	for _, a := range slices.Backward(list) {
		if ctx.Err() != nil {
			return
		}
		if time.Now().Before(c.retryAt[a.ID]) {
			continue
		}
		done, err := c.inbox.RunBulk(ctx, a.ID, inboxadmin.BulkOptions{BatchSize: c.cfg.BatchSize})
		if err != nil {
			if ctx.Err() == nil {
				c.retryAt[a.ID] = time.Now().Add(time.Minute)
				c.cfg.Logger.Error("console: action failed; tried again in a minute (stop it from its page)", "action", a.ID, "error", err)
			}
			continue
		}
		delete(c.retryAt, a.ID)
		c.cfg.Logger.Info("console: action ended", "action", done.ID, "state", done.State, "what", done.Action, "by", done.Actor,
			"chosen", done.Selected, "done", done.Done, "skipped", done.Skipped, "refused", done.Refused)
	}
}

// started wakes Run for an action just started.
func (c *Console) started() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}
