package console

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

//go:embed pages.html
var pagesFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"ago": func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
	"at":  func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"clip": func(s string, n int) string {
		if utf8.RuneCountInString(s) <= n {
			return s
		}
		return string([]rune(s)[:n]) + "…"
	},
	"json":  func(v any) string { b, _ := json.Marshal(v); return string(b) },
	"seg":   url.PathEscape,
	"kinds": func() []string { return []string{inbox.KindDeadLetter, inbox.KindPayloadConflict, inbox.KindInvalid} },
	"list":  func(s ...string) []string { return s },
	"bulk":  newBulkForms,
}).ParseFS(pagesFS, "pages.html"))

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { seeOther(w, "groups") })
	m.HandleFunc("GET /groups", c.groups)
	m.HandleFunc("GET /groups/{consumer}/{group}", c.group)
	m.HandleFunc("GET /messages/{id}", c.message)
	m.HandleFunc("POST /messages/{id}/retry", c.retryOne)
	m.HandleFunc("POST /messages/{id}/drop", c.dropOne)
	m.HandleFunc("POST /bulk/preview", c.preview)
	m.HandleFunc("POST /bulk/start", c.start)
	m.HandleFunc("GET /actions", c.actions)
	m.HandleFunc("GET /actions/{id}", c.action)
	m.HandleFunc("POST /actions/{id}/stop", c.stop)
	m.HandleFunc("GET /held", c.held)
	m.HandleFunc("GET /parked", c.parked)
	c.mux = m
}

// view is what every page gets.
type view struct {
	Title string
	User  User
	CSRF  string
	Base  string // the path back to the console's root from this page
	Page  string
	Data  any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, data any) {
	u := userOf(r)
	depth := strings.Count(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	v := view{Title: c.cfg.Title, User: u, CSRF: c.csrf(u, time.Now()), Base: strings.Repeat("../", depth), Page: page, Data: data}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := pages.ExecuteTemplate(w, "page", v); err != nil {
		c.cfg.Logger.Error("console: rendering", "page", page, "error", err)
	}
}

// seeOther sends the browser to rel, a path relative to the request's: so
// the console works mounted under any prefix (http.Redirect would make it
// absolute from the path it saw).
func seeOther(w http.ResponseWriter, rel string) {
	w.Header().Set("Location", rel)
	w.WriteHeader(http.StatusSeeOther)
}

func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, reason string) {
	c.render(w, r, status, "refused", reason)
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, inboxadmin.ErrNotFound), errors.Is(err, inboxadmin.ErrNoAction):
		status = http.StatusNotFound
	case errors.Is(err, inboxadmin.ErrResolved), errors.Is(err, inboxadmin.ErrNotRedrivable), errors.Is(err, inboxadmin.ErrSelectionChanged), errors.Is(err, inboxadmin.ErrPlanStarted),
		errors.Is(err, inboxadmin.ErrNothingSelected):
		status = http.StatusConflict
	case errors.Is(err, errBadRequest):
		status = http.StatusBadRequest
	}
	if status == http.StatusInternalServerError {
		c.cfg.Logger.Error("console: request failed", "path", r.URL.Path, "error", err)
	}
	c.refuse(w, r, status, err.Error())
}

var errBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

func (c *Console) groups(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := inboxadmin.GroupFilter{Consumer: q.Get("consumer"), Kind: q.Get("kind"), EventType: q.Get("event_type")}
	list, err := c.inbox.ListGroups(r.Context(), f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "groups", struct {
		Filter inboxadmin.GroupFilter
		Groups []inboxadmin.Group
	}{f, list})
}

func (c *Console) group(w http.ResponseWriter, r *http.Request) {
	after, err := int64Param(r.URL.Query().Get("after"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	consumer, group := r.PathValue("consumer"), r.PathValue("group")
	list, err := c.inbox.ListQuarantined(r.Context(), inboxadmin.QuarantineFilter{Consumer: consumer, Group: group, After: after, Limit: c.cfg.PageSize + 1, WithoutPayloads: true})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	list, next := page(list, c.cfg.PageSize, func(q inboxadmin.Quarantined) int64 { return q.ID })
	var g *inboxadmin.Group
	found, ok, err := c.inbox.GetGroup(r.Context(), consumer, group)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if ok {
		g = &found
	}
	c.render(w, r, http.StatusOK, "group", struct {
		Consumer, ID string
		Group        *inboxadmin.Group
		Messages     []inboxadmin.Quarantined
		After, Next  int64
	}{consumer, group, g, list, after, next})
}

// shown is a quarantined message as the page shows it: its payload as
// text when it is UTF-8, else as hex.
type shown struct {
	inboxadmin.Quarantined
	Text    string
	Binary  bool
	Headers [][2]string
	Raw     [][2]string
}

func (c *Console) message(w http.ResponseWriter, r *http.Request) {
	id, err := int64Param(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	q, err := c.inbox.GetQuarantined(r.Context(), id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	s := shown{Quarantined: q, Text: string(q.Payload)}
	if !utf8.Valid(q.Payload) {
		s.Text, s.Binary = fmt.Sprintf("% x", q.Payload), true
	}
	s.Headers, s.Raw = sorted(q.Metadata), sorted(q.RawMetadata)
	c.render(w, r, http.StatusOK, "message", s)
}

func sorted(m map[string]string) [][2]string {
	out := make([][2]string, 0, len(m))
	for k, v := range m {
		out = append(out, [2]string{k, v})
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}

func (c *Console) retryOne(w http.ResponseWriter, r *http.Request) {
	id, err := int64Param(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	u := userOf(r)
	res, err := c.inbox.Retry(r.Context(), id, u.Name)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.Info("console: retry", "by", u.Name, "quarantined", id, "redriven", res.Redriven, "note", res.Note)
	seeOther(w, "../"+strconv.FormatInt(id, 10))
}

func (c *Console) dropOne(w http.ResponseWriter, r *http.Request) {
	id, err := int64Param(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	why := strings.TrimSpace(r.PostFormValue("why"))
	if why == "" {
		c.fail(w, r, badRequest("a drop needs why: it is kept as its record"))
		return
	}
	u := userOf(r)
	if _, err := c.inbox.Drop(r.Context(), id, u.Name, why); err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.Info("console: drop", "by", u.Name, "quarantined", id, "why", why)
	seeOther(w, "../"+strconv.FormatInt(id, 10))
}

// selection reads a bulk form's selection and action.
func selection(r *http.Request) (string, inboxadmin.Selection, string, error) {
	action, why := r.PostFormValue("action"), strings.TrimSpace(r.PostFormValue("why"))
	s := inboxadmin.Selection{Consumer: r.PostFormValue("consumer"), Group: r.PostFormValue("group"), Kind: r.PostFormValue("kind"),
		Holding: r.PostFormValue("holding") == "1", Parked: r.PostFormValue("parked") == "1", Topic: r.PostFormValue("topic")}
	upTo, err := int64Param(r.PostFormValue("up_to"))
	if err != nil {
		return "", s, "", err
	}
	s.UpTo = upTo
	switch {
	case action != inboxadmin.ActionRetry && action != inboxadmin.ActionDrop:
		return "", s, "", badRequest("no action %q: %s or %s", clip(action), inboxadmin.ActionRetry, inboxadmin.ActionDrop)
	case s.Consumer == "":
		return "", s, "", badRequest("a bulk action is for one consumer")
	case s.Group == "" && s.Kind == "" && !s.Holding && !s.Parked:
		return "", s, "", badRequest("a bulk action needs a group, a kind, the keys held or the parked rows")
	case action == inboxadmin.ActionDrop && why == "":
		return "", s, "", badRequest("a drop needs why: it is kept as its record")
	}
	return action, s, why, nil
}

// preview is the dry run: it counts what the form chose and asks for a
// confirmation of that count.
func (c *Console) preview(w http.ResponseWriter, r *http.Request) {
	action, s, why, err := selection(r)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	plan, err := c.inbox.DryRun(r.Context(), s)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "preview", struct {
		Action, Why string
		Plan        inboxadmin.Plan
	}{action, why, plan})
}

// start starts a confirmed bulk action, if the selection still holds the
// count confirmed, and sends the browser to its progress.
func (c *Console) start(w http.ResponseWriter, r *http.Request) {
	action, s, why, err := selection(r)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	expect, err := int64Param(r.PostFormValue("expect"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	plan := inboxadmin.Plan{Selection: s, Count: expect, Digest: r.PostFormValue("digest"), ID: r.PostFormValue("plan")}
	if s.UpTo == 0 || plan.Digest == "" || plan.ID == "" {
		c.fail(w, r, badRequest("a bulk action starts from its dry run's confirmation"))
		return
	}
	u := userOf(r)
	a, err := c.inbox.StartBulk(r.Context(), action, plan, u.Name, why)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.Info("console: bulk action started", "action", a.ID, "what", action, "by", u.Name, "chosen", a.Selected, "selection", s)
	c.started()
	seeOther(w, "../actions/"+strconv.FormatInt(a.ID, 10))
}

func (c *Console) actions(w http.ResponseWriter, r *http.Request) {
	before, err := int64Param(r.URL.Query().Get("before"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	list, err := c.inbox.ListActions(r.Context(), inboxadmin.ActionFilter{Consumer: r.URL.Query().Get("consumer"), Before: before, Limit: c.cfg.PageSize + 1})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	list, next := page(list, c.cfg.PageSize, func(a inboxadmin.Action) int64 { return a.ID })
	c.render(w, r, http.StatusOK, "actions", struct {
		Actions []inboxadmin.Action
		Next    int64
	}{list, next})
}

func (c *Console) action(w http.ResponseWriter, r *http.Request) {
	id, err := int64Param(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	a, err := c.inbox.GetAction(r.Context(), id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	after, err := int64Param(r.URL.Query().Get("after"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	items, err := c.inbox.ListActionItems(r.Context(), id, after, c.cfg.PageSize+1)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	items, next := page(items, c.cfg.PageSize, func(it inboxadmin.ActionItem) int64 { return it.QuarantineID })
	c.render(w, r, http.StatusOK, "action", struct {
		Action inboxadmin.Action
		Items  []inboxadmin.ActionItem
		Next   int64
	}{a, items, next})
}

func (c *Console) held(w http.ResponseWriter, r *http.Request) {
	list, err := c.inbox.ListHeld(r.Context(), r.URL.Query().Get("consumer"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	consumers := distinct(list, func(h inboxadmin.HeldKey) string { return h.Consumer }) // each with a bulk action on its holders
	c.render(w, r, http.StatusOK, "held", struct {
		Keys      []inboxadmin.HeldKey
		Consumers []string
	}{list, consumers})
}

func (c *Console) parked(w http.ResponseWriter, r *http.Request) {
	after, err := int64Param(r.URL.Query().Get("after"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	list, err := c.outbox.ListParked(r.Context(), outboxadmin.ParkedFilter{After: after, Limit: c.cfg.PageSize + 1})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	list, next := page(list, c.cfg.PageSize, func(p outboxadmin.ParkedRow) int64 { return p.ID })
	topics := distinct(list, func(p outboxadmin.ParkedRow) string { return p.Topic }) // each with a bulk action on its parked rows
	c.render(w, r, http.StatusOK, "parked", struct {
		Rows     []outboxadmin.ParkedRow
		Next     int64
		Topics   []string
		Consumer string // the history's name for this database's outbox: the console's title
	}{list, next, topics, c.cfg.Title})
}

// stop stops a running action (inboxadmin.Admin.StopBulk).
func (c *Console) stop(w http.ResponseWriter, r *http.Request) {
	id, err := int64Param(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	u := userOf(r)
	a, err := c.inbox.StopBulk(r.Context(), id, u.Name)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.cfg.Logger.Info("console: action stopped", "action", id, "by", u.Name, "state", a.State, "done", a.Done, "chosen", a.Selected)
	seeOther(w, "../"+strconv.FormatInt(id, 10))
}

// page cuts list, read with one row more than size, to size rows, and
// returns the key of its last row when there is a next page (0 when not).
func page[T any](list []T, size int, key func(T) int64) ([]T, int64) {
	if len(list) <= size {
		return list, 0
	}
	list = list[:size]
	return list, key(list[len(list)-1])
}

func int64Param(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("%q is not an id", clip(s))
	}
	return n, nil
}

// distinct returns key of each of list, each once, in the order first met.
func distinct[T any](list []T, key func(T) string) []string {
	var out []string
	for _, v := range list {
		if k := key(v); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// bulkForms are a selection's Retry all and Drop all forms (the template
// "bulk"): posted to action, with the selection's fields as hidden inputs,
// ids id-retry and id-drop when id is set.
type bulkForms struct {
	CSRF, Action, ID string
	Fields           [][2]string
}

// newBulkForms takes the fields as name, value pairs.
func newBulkForms(csrf, action, id string, pairs ...string) (bulkForms, error) {
	if len(pairs)%2 != 0 {
		return bulkForms{}, fmt.Errorf("bulk: %d fields: want name, value pairs", len(pairs))
	}
	f := bulkForms{CSRF: csrf, Action: action, ID: id}
	for i := 0; i < len(pairs); i += 2 {
		f.Fields = append(f.Fields, [2]string{pairs[i], pairs[i+1]})
	}
	return f, nil
}
