package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/console"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

const consumer = "billing"

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	con  *console.Console
	srv  *httptest.Server
}

// setup returns a console with users on a fresh database with the inbox's
// tables, served on loopback.
func setup(t *testing.T, users ...console.User) *testBundle {
	t.Helper()
	b := &testBundle{ctx: t.Context(), pool: pg.TestDatabase(t)}
	require.NoError(t, inbox.Migrate(b.ctx, b.pool))
	var err error
	b.con, err = console.New(console.Config{Pool: b.pool, Title: "billing", Users: users, PageSize: 20})
	require.NoError(t, err)
	b.srv = httptest.NewServer(b.con)
	t.Cleanup(b.srv.Close)
	return b
}

// quarantine writes n open dead letters of poison's shape: reason(i), the
// message id id(i), payload and headers as given.
func (b *testBundle) quarantine(t *testing.T, n int, reason func(int) string, id func(int) string, payload []byte, md map[string]string) {
	t.Helper()
	if md == nil {
		md = map[string]string{}
	}
	for i := range n {
		mid := id(i)
		_, err := b.pool.Exec(b.ctx, `WITH i AS (INSERT INTO inbox_messages (consumer, message_id, payload_sha256, status, topic)
				VALUES ($1, $2, '\x00', 'dead_lettered', 'payments'))
			INSERT INTO inbox_quarantine (consumer, message_id, kind, reason, attempts, topic, payload_sha256, payload, metadata)
			VALUES ($1, $2, 'dead_letter', $3, 5, 'payments', '\x00', $4, $5)`, consumer, mid, reason(i), payload, md)
		require.NoError(t, err)
	}
}

func uuids(int) string { return uuid.NewString() }

// client is a browser of user (none: anonymous), following redirects.
type client struct {
	t      *testing.T
	b      *testBundle
	user   *console.User
	http   *http.Client
	lastCT string
}

func (b *testBundle) as(t *testing.T, u *console.User) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, b: b, user: u, http: &http.Client{Jar: jar}}
}

func (c *client) do(method, path string, form url.Values) (int, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(c.b.ctx, method, c.b.srv.URL+path, body)
	require.NoError(c.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", c.b.srv.URL)
	}
	if c.user != nil {
		req.SetBasicAuth(c.user.Name, c.user.Secret)
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	c.lastCT = resp.Header.Get("Content-Type")
	return resp.StatusCode, string(page)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the form token of the page at path.
func (c *client) csrf(path string) string {
	c.t.Helper()
	status, page := c.do(http.MethodGet, path, nil)
	require.Equal(c.t, http.StatusOK, status, page)
	m := csrfField.FindStringSubmatch(page)
	require.NotNil(c.t, m, "no form on %s:\n%s", path, page)
	return m[1]
}

var (
	alice = console.User{Name: "alice", Role: console.Operator, Secret: "alice-secret-0123456789"}
	vic   = console.User{Name: "vic", Role: console.Viewer, Secret: "vic-secret-0123456789ab"}
)

// groupPath is the path of the console's only group.
func (b *testBundle) groupPath(t *testing.T) string {
	t.Helper()
	groups, err := inboxadmin.New(b.pool).ListGroups(b.ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, groups, 1)
	return "/groups/" + consumer + "/" + groups[0].ID
}

// TestClosedByDefault: without logins the console answers loopback clients
// only; with logins, every request needs one, and the wrong secret is
// refused like none.
func TestClosedByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	remote := httptest.NewRequest(http.MethodGet, "/groups", nil) // from 192.0.2.1
	w := httptest.NewRecorder()
	b.con.ServeHTTP(w, remote)
	require.Equal(t, http.StatusForbidden, w.Code)
	require.Contains(t, w.Body.String(), "loopback clients only")
	status, _ := b.as(t, nil).do(http.MethodGet, "/groups", nil)
	require.Equal(t, http.StatusOK, status, "a loopback client")

	b = setup(t, alice, vic)
	status, page := b.as(t, nil).do(http.MethodGet, "/groups", nil)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, page, "needs a login")
	wrong := alice
	wrong.Secret = "not-alice-secret-at-all"
	status, _ = b.as(t, &wrong).do(http.MethodGet, "/groups", nil)
	require.Equal(t, http.StatusUnauthorized, status)
	status, _ = b.as(t, &vic).do(http.MethodGet, "/groups", nil)
	require.Equal(t, http.StatusOK, status)

	req, err := http.NewRequestWithContext(b.ctx, http.MethodGet, b.srv.URL+"/groups", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+vic.Secret)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "a bearer token")
}

// TestViewersReadOperatorsAct: a viewer sees the pages without their forms
// and is refused any action; an operator's action needs the form's token,
// its own: a token of another user, or none, is refused.
func TestViewersReadOperatorsAct(t *testing.T) {
	t.Parallel()
	b := setup(t, alice, vic, console.User{Name: "olga", Role: console.Operator, Secret: "olga-secret-0123456789"})
	b.quarantine(t, 1, func(int) string { return "bad amount" }, uuids, []byte(`{}`), nil)
	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{})
	require.NoError(t, err)
	msg := fmt.Sprintf("/messages/%d", open[0].ID)

	viewer := b.as(t, &vic)
	status, page := viewer.do(http.MethodGet, msg, nil)
	require.Equal(t, http.StatusOK, status)
	require.NotContains(t, page, `id="retry"`, "a viewer sees no action")
	require.NotContains(t, page, `name="csrf"`)
	token := b.as(t, &alice).csrf(msg)
	status, page = viewer.do(http.MethodPost, msg+"/retry", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, page, "vic is a viewer")

	operator := b.as(t, &alice)
	status, page = operator.do(http.MethodPost, msg+"/retry", url.Values{})
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, page, "reload the page")
	status, _ = operator.do(http.MethodPost, msg+"/retry", url.Values{"csrf": {b.as(t, &console.User{Name: "olga", Role: console.Operator, Secret: "olga-secret-0123456789"}).csrf(msg)}})
	require.Equal(t, http.StatusForbidden, status, "another operator's token")
	q, err := inboxadmin.New(b.pool).GetQuarantined(b.ctx, open[0].ID)
	require.NoError(t, err)
	require.Nil(t, q.ResolvedAt, "nothing done by the refused")

	status, page = operator.do(http.MethodPost, msg+"/retry", url.Values{"csrf": {token}})
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, "redriven by alice")
	history, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{})
	require.NoError(t, err)
	require.Len(t, history, 1)
	require.Equal(t, "alice", history[0].Actor)
}

// TestHostileStringsAreText: markup in a reason, a message id, a header, a
// payload and a producer key is shown as text on every page, never run.
func TestHostileStringsAreText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const xss = `<script>alert(1)</script><img src=x onerror=alert(2)>"'&`
	b.quarantine(t, 3, func(int) string { return "handler: sku " + xss + " unknown" },
		func(i int) string { return fmt.Sprintf(`%s-%d`, xss, i) },
		[]byte(`{"sku":"`+xss+`"}`), map[string]string{xss: xss, "signature_key_id": xss, "event_type": xss})
	b.quarantine(t, 1, func(int) string { return "binary" }, uuids, []byte{0xff, 0x00, '<', 'b', '>'}, nil)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO inbox_quarantine (consumer, message_id, kind, reason, payload_sha256, payload)
		VALUES ($1, 'm-1', 'invalid', 'hostile consumer', '\x00', '\x00')`, `x"><b>consumer</b>`)
	require.NoError(t, err)
	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
	require.NoError(t, err)
	groups, err := inboxadmin.New(b.pool).ListGroups(b.ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(t, err)
	c := b.as(t, nil)
	paths := []string{"/groups", "/actions", "/held", "/parked", fmt.Sprintf("/messages/%d", open[3].ID)}
	for _, g := range groups {
		paths = append(paths, "/groups/"+consumer+"/"+g.ID)
	}
	for _, q := range open[:3] {
		paths = append(paths, fmt.Sprintf("/messages/%d", q.ID))
	}
	for _, path := range paths {
		status, page := c.do(http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, status, path)
		require.Equal(t, "text/html; charset=utf-8", c.lastCT)
		require.NotContains(t, page, "<script", "%s runs a script", path)
		require.NotContains(t, page, "<img", "%s shows markup from a message", path)
		require.NotContains(t, page, "<b>consumer</b>", "%s shows markup from a consumer's name", path)
	}
	_, page := c.do(http.MethodGet, fmt.Sprintf("/messages/%d", open[0].ID), nil)
	require.Contains(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;", "the markup shown as text")
	_, page = c.do(http.MethodGet, fmt.Sprintf("/messages/%d", open[3].ID), nil)
	require.Contains(t, page, "ff 00 3c 62 3e", "a binary payload as hex")

	// The security headers every page carries.
	resp, err := http.Get(b.srv.URL + "/groups")
	require.NoError(t, err)
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "frame-ancestors 'none'", "form-action 'self'"} {
		require.Contains(t, csp, want)
	}
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	require.Equal(t, "no-referrer", resp.Header.Get("Referrer-Policy"))
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	status, page := c.do(http.MethodGet, "/groups", nil)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `href="groups/x%22%3E%3Cb%3Econsumer%3C%2Fb%3E/`, "a hostile consumer's name escaped in a link")
}

// TestBulkRetryFromTheConsole: an operator opens a group, asks to retry it
// all, is shown the count, confirms it, and the action runs in Run: each
// message written back once; a confirmation of a count that is no longer
// the selection's is refused; the history names the operator.
func TestBulkRetryFromTheConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, alice)
	b.quarantine(t, 30, func(i int) string { return fmt.Sprintf("handler: amount %d above the limit", i) }, uuids, []byte(`{}`), nil)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- b.con.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	c := b.as(t, &alice)
	group := b.groupPath(t)
	token := c.csrf(group)
	// Its 30 messages, 20 a page: the second page has the other 10.
	_, page := c.do(http.MethodGet, group, nil)
	require.Equal(t, 20, strings.Count(page, `<a href="../../messages/`))
	for _, what := range []string{"retry", "drop"} {
		require.Contains(t, page, `<form method="post" action="../../bulk/preview" class="inline" id="bulk-`+what+`"><input type="hidden" name="csrf" value="`+token+
			`"><input type="hidden" name="consumer" value="`+consumer+`"><input type="hidden" name="group" value="`+group[len(group)-16:]+`"><input type="hidden" name="action" value="`+what+`">`)
	}
	next := regexp.MustCompile(`<a id="next" href="\?after=(\d+)">`).FindStringSubmatch(page)
	require.NotNil(t, next, page)
	_, page = c.do(http.MethodGet, group+"?after="+next[1], nil)
	require.Equal(t, 10, strings.Count(page, `<a href="../../messages/`))
	require.NotContains(t, page, `id="next"`)
	status, page := c.do(http.MethodPost, "/bulk/preview", url.Values{"csrf": {token}, "consumer": {consumer}, "group": {group[len(group)-16:]}, "action": {"retry"}})
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, `<b id="count">30</b>`)
	form := url.Values{"csrf": {token}}
	for _, f := range regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`).FindAllStringSubmatch(page, -1) {
		form.Set(f[1], f[2])
	}
	require.Equal(t, "30", form.Get("expect"))

	wrong := url.Values{}
	for k, v := range form {
		wrong[k] = v
	}
	wrong.Set("expect", "29")
	status, page = c.do(http.MethodPost, "/bulk/start", wrong)
	require.Equal(t, http.StatusConflict, status)
	require.Contains(t, page, "changed since its dry run")

	status, page = c.do(http.MethodPost, "/bulk/start", form)
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, "Action ")
	id := regexp.MustCompile(`<h1>Action (\d+):`).FindStringSubmatch(page)
	require.NotNil(t, id, page)
	// The browser reloads the page every second; the test reads it until
	// it says finished, failing only if nothing moves for a minute.
	last, moved := int64(-1), time.Now()
	for !strings.Contains(page, "finished: 30 of 30 done") {
		a, err := inboxadmin.New(b.pool).GetAction(b.ctx, mustInt(t, id[1]))
		require.NoError(t, err)
		if a.Done != last {
			last, moved = a.Done, time.Now()
		}
		require.Less(t, time.Since(moved), time.Minute, "the action stopped moving:\n%s", page)
		time.Sleep(20 * time.Millisecond) // polling what the page shows
		_, page = c.do(http.MethodGet, "/actions/"+id[1], nil)
	}
	var written, twice int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT message_id), count(*) - count(DISTINCT message_id) FROM outbox_messages WHERE topic = 'payments'`).Scan(&written, &twice))
	require.Equal(t, [2]int{30, 0}, [2]int{written, twice})
	_, page = c.do(http.MethodGet, "/actions", nil)
	require.Contains(t, page, `<td class="by">alice</td>`)
	require.Equal(t, 1, strings.Count(page, `<td class="what">retry</td>`))
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// TestLoginsAreChecked: a login is its name and its secret together; a
// loopback client forwarded by a proxy, or naming another host, is no
// loopback client; logins that say nothing sure are refused at New.
func TestLoginsAreChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, alice, vic)
	impostor := console.User{Name: "mallory", Role: console.Operator, Secret: alice.Secret}
	status, _ := b.as(t, &impostor).do(http.MethodGet, "/groups", nil)
	require.Equal(t, http.StatusUnauthorized, status, "alice's secret under another name")

	b = setup(t)
	for _, h := range []map[string]string{{"X-Forwarded-For": "203.0.113.9"}, {"Forwarded": "for=203.0.113.9"}} {
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/groups", nil)
		req.RemoteAddr = "127.0.0.1:4242"
		for k, v := range h {
			req.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		b.con.ServeHTTP(w, req)
		require.Equal(t, http.StatusForbidden, w.Code, "forwarded: %v", h)
	}
	rebound := httptest.NewRequest(http.MethodGet, "http://attacker.example/groups", nil)
	rebound.RemoteAddr = "127.0.0.1:4242"
	w := httptest.NewRecorder()
	b.con.ServeHTTP(w, rebound)
	require.Equal(t, http.StatusForbidden, w.Code, "a name an attacker's DNS points at 127.0.0.1")
	put := httptest.NewRequest(http.MethodPut, "http://127.0.0.1/groups", nil)
	put.RemoteAddr = "127.0.0.1:4242"
	w = httptest.NewRecorder()
	b.con.ServeHTTP(w, put)
	require.Equal(t, http.StatusMethodNotAllowed, w.Code)

	for _, users := range [][]console.User{
		{{Name: "alice", Role: console.Operator, Secret: ""}},
		{alice, {Name: "eve", Role: console.Viewer, Secret: alice.Secret}},
		{alice, {Name: "alice", Role: console.Viewer, Secret: "another-secret-0123456789"}},
		{{Name: "bob", Role: "admin", Secret: "bob-secret-0123456789ab"}},
	} {
		_, err := console.New(console.Config{Pool: b.pool, Users: users})
		require.Error(t, err, "%+v", users)
	}
}

// TestActionsAreSameOrigin: an action posted from another site's page is
// refused by the console itself, whatever server it is mounted in.
func TestActionsAreSameOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t, alice)
	b.quarantine(t, 1, func(int) string { return "bad amount" }, uuids, []byte(`{}`), nil)
	c := b.as(t, &alice)
	token := c.csrf(b.groupPath(t))
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.srv.URL+"/bulk/preview",
		strings.NewReader(url.Values{"csrf": {token}, "consumer": {consumer}, "kind": {"dead_letter"}, "action": {"retry"}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.SetBasicAuth(alice.Name, alice.Secret)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// TestMountedUnderAPrefix: mounted under /console/, every link and every
// redirect stays under it; an operator stops a running action from its
// page.
func TestMountedUnderAPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, alice)
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", b.con))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b.srv = srv
	b.quarantine(t, 2, func(int) string { return "bad amount" }, uuids, []byte(`{}`), nil)
	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{})
	require.NoError(t, err)
	c := b.as(t, &alice)
	msg := fmt.Sprintf("/console/messages/%d", open[0].ID)
	status, page := c.do(http.MethodPost, msg+"/retry", url.Values{"csrf": {c.csrf(msg)}})
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, "redriven by alice", "the redirect came back to the message, under the prefix")

	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionDrop, plan, "alice", "test")
	require.NoError(t, err)
	action := fmt.Sprintf("/console/actions/%d", a.ID)
	status, page = c.do(http.MethodGet, action, nil)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `id="stop"`)
	status, page = c.do(http.MethodPost, action+"/stop", url.Values{"csrf": {c.csrf(action)}})
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, "stopped by alice: 0 of 1 done")
	require.NotContains(t, page, `id="stop"`)
	for _, href := range regexp.MustCompile(`(?:href|action)="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		u, err := url.Parse(srv.URL + action)
		require.NoError(t, err)
		ref, err := u.Parse(href[1])
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(ref.Path, "/console/"), "%s leads out of /console/: %s", href[1], ref.Path)
	}
}

// TestHeldKeysInBulk: the held-keys page offers an operator one action on
// every dead letter of a consumer that holds a key (inboxadmin.Selection.Holding),
// counted first: the dry run counts the holders and no other dead letter.
func TestHeldKeysInBulk(t *testing.T) {
	t.Parallel()
	b := setup(t, alice)
	var ids []string
	b.quarantine(t, 3, func(int) string { return "handler: poison" }, func(int) string { id := uuid.NewString(); ids = append(ids, id); return id }, []byte(`{}`), nil)
	for i, id := range ids[:2] { // two of the three hold a key
		_, err := b.pool.Exec(b.ctx, `INSERT INTO inbox_held_keys (consumer, topic, partition_key, holder) VALUES ($1, 'payments', $2, $3)`,
			consumer, fmt.Sprintf("key-%d", i), id)
		require.NoError(t, err)
	}
	c := b.as(t, &alice)
	_, page := c.do(http.MethodGet, "/held", nil)
	require.Contains(t, page, `name="holding" value="1"`)
	token := c.csrf("/held")
	status, page := c.do(http.MethodPost, "/bulk/preview", url.Values{"csrf": {token}, "consumer": {consumer}, "holding": {"1"}, "action": {"retry"}})
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, `<b id="count">2</b>`, "the holders alone")
	require.Contains(t, page, `name="holding" value="1"`, "the confirmation keeps the selection")

	// Confirmed twice (a double click), it is one action; confirmed with
	// another digest (as many, but other dead letters), or none, nothing.
	form := url.Values{"csrf": {token}}
	for _, f := range regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`).FindAllStringSubmatch(page, -1) {
		form.Set(f[1], f[2])
	}
	digest, plan := form.Get("digest"), form.Get("plan")
	require.Len(t, digest, 16)
	require.NotEmpty(t, plan)
	for _, f := range [][2]string{{"digest", ""}, {"digest", "0123456789abcdef"}, {"plan", ""}} {
		form.Set(f[0], f[1])
		status, page = c.do(http.MethodPost, "/bulk/start", form)
		require.Contains(t, []int{http.StatusBadRequest, http.StatusConflict}, status, page)
		form.Set("digest", digest)
		form.Set("plan", plan)
	}
	var started []string
	for range 2 {
		status, page = c.do(http.MethodPost, "/bulk/start", form)
		require.Equal(t, http.StatusOK, status, page)
		id := regexp.MustCompile(`<h1>Action (\d+):`).FindStringSubmatch(page)
		require.NotNil(t, id, page)
		started = append(started, id[1])
	}
	require.Equal(t, started[0], started[1], "confirmed twice, one action")
	history, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, history, 1)
}

// TestParkedRowsInBulk: the parked page offers an operator one action on
// every parked row of a topic, counted first; confirmed, it unparks them
// (the relay sends them again) and is in the history, its items outbox
// rows, not messages.
func TestParkedRowsInBulk(t *testing.T) {
	t.Parallel()
	b := setup(t, alice)
	for range 3 {
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(b.ctx, tx, "payments.events", outbox.NewMessage("k", []byte("too large")))
		}))
	}
	_, err := b.pool.Exec(b.ctx, `UPDATE outbox_messages SET parked_at = now(), park_reason = 'record too large'`)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- b.con.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	c := b.as(t, &alice)
	_, page := c.do(http.MethodGet, "/parked", nil)
	require.Contains(t, page, `name="parked" value="1"`)
	token := c.csrf("/parked")
	status, page := c.do(http.MethodPost, "/bulk/preview", url.Values{"csrf": {token}, "consumer": {"billing"}, "parked": {"1"}, "topic": {"payments.events"}, "action": {"retry"}})
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, `<b id="count">3</b>`)
	form := url.Values{"csrf": {token}}
	for _, f := range regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`).FindAllStringSubmatch(page, -1) {
		form.Set(f[1], f[2])
	}
	require.Equal(t, "1", form.Get("parked"), "the confirmation keeps the selection")
	status, page = c.do(http.MethodPost, "/bulk/start", form)
	require.Equal(t, http.StatusOK, status, page)
	id := regexp.MustCompile(`<h1>Action (\d+):`).FindStringSubmatch(page)
	require.NotNil(t, id, page)
	a, err := inboxadmin.New(b.pool).RunBulk(b.ctx, mustInt(t, id[1]), inboxadmin.BulkOptions{}) // or the console's Run: each row once either way
	require.NoError(t, err)
	require.Equal(t, int64(3), a.Done+a.Skipped)
	var stillParked int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox_messages WHERE parked_at IS NOT NULL`).Scan(&stillParked))
	require.Zero(t, stillParked)
	_, page = c.do(http.MethodGet, "/actions/"+id[1], nil)
	require.Contains(t, page, "<th>outbox row</th>")
	require.NotContains(t, page, `href="../messages/`)
}

// TestGroupsFilter: the groups page filters by consumer, kind and event
// type, and shows the filter it applied.
func TestGroupsFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.quarantine(t, 2, func(int) string { return "handler: unknown field" }, uuids, []byte(`{}`), map[string]string{"event_type": "OrderPaid"})
	b.quarantine(t, 3, func(int) string { return "handler: unknown field" }, uuids, []byte(`{}`), map[string]string{"event_type": "OrderCaptured"})
	c := b.as(t, nil)
	_, page := c.do(http.MethodGet, "/groups", nil)
	require.Equal(t, 2, strings.Count(page, `class="num count"`), page)
	_, page = c.do(http.MethodGet, "/groups?event_type=OrderPaid", nil)
	require.Equal(t, 1, strings.Count(page, `class="num count"`), page)
	require.Contains(t, page, `<td class="num count">2</td>`)
	require.Contains(t, page, `name="event_type" placeholder="event type" value="OrderPaid"`)
	_, page = c.do(http.MethodGet, "/groups?kind=invalid", nil)
	require.Contains(t, page, `id="empty"`)
	require.Contains(t, page, `<option selected>invalid</option>`)
}
