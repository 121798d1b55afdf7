package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/dashboard"
)

// bad is one malformed request to a route: method and path (the path as
// sent, escapes and all), a body (sent as application/json unless ctype
// says otherwise) and headers.
type bad struct {
	name, method, path, body, ctype string
	header                          map[string]string
}

// routes is every route of every server, by its pattern as registered
// (TestRouteTableIsComplete holds it to the source), with the malformed
// requests each must answer with a 4xx and a reason. Every route also gets
// an unknown Host; every state-changing one a cross-site request and a
// body that is not JSON (common, below).
func routes() map[string][]bad {
	unknown := uuid.NewString()
	ids := func(method, format, body string) []bad {
		var out []bad
		for _, id := range []string{"not-an-id", "%FF", "%00", "urn:uuid:" + unknown, "%7B" + strings.ToUpper(unknown) + "%7D", strings.Repeat("a", 3000), "'%20OR%201=1%20--"} {
			out = append(out, bad{name: "id " + id, method: method, path: fmt.Sprintf(format, id), body: body})
		}
		return out
	}
	bodies := func(method, path string, more ...string) []bad {
		out := []bad{
			{name: "garbage", method: method, path: path, body: `{`},
			{name: "array of a number", method: method, path: path, body: `[1]`},
			{name: "null", method: method, path: path, body: `null`},
			{name: "oversized", method: method, path: path, body: `{"x":"` + strings.Repeat("x", 5<<20) + `"}`},
			{name: "not UTF-8", method: method, path: path, body: "{\"x\":\"\xff\"}"},
		}
		for i, b := range more {
			out = append(out, bad{name: fmt.Sprintf("body %d", i), method: method, path: path, body: b})
		}
		return out
	}
	line := `{"sku":"sku-00","quantity":1}`
	return map[string][]bad{
		// orders
		"POST /orders": bodies("POST", "/orders", `{"lines":[`+line+`],"lines":[]}`, `{"Lines":[`+line+`]}`, `{"lines":[`+line+`]} {}`,
			`{"lines":[{"sku":"sku-00\u0000","quantity":1}]}`, `{"lines":[{"sku":"sku-00","quantity":9223372036854775808}]}`, `{"lines":[`+line+`],"card":"<script>"}`),
		"POST /orders/{id}/pay":           ids("POST", "/orders/%s/pay", ""),
		"POST /orders/{id}/payment/retry": append(ids("POST", "/orders/%s/payment/retry", `{}`), bodies("POST", "/orders/"+unknown+"/payment/retry", `{"card":1}`)...),
		"POST /orders/{id}/payment/refund": append(ids("POST", "/orders/%s/payment/refund", `{"reason":"r"}`), bodies("POST", "/orders/"+unknown+"/payment/refund",
			`{}`, `{"reason":""}`, `{"reason":1}`, `{"reason":"`+strings.Repeat("r", 501)+`"}`, `{"reason":"a\u0000b"}`, `{"reason":"<script>alert(1)</script>\n"}`)...),
		"GET /orders/{id}": ids("GET", "/orders/%s", ""),
		"GET /orders":      nil,
		// inventory
		"PUT /stock": bodies("PUT", "/stock", `[{"sku":"a","available":1},{"sku":"a","available":2}]`, `[{"sku":"a","available":1,"reserved":5}]`,
			`[{"sku":"a","available":-1}]`, `[{"sku":"a\u0000","available":1}]`, `[{"sku":" a","available":1}]`, `{"sku":"a","available":1}`),
		"GET /stock":       nil,
		"GET /stock/{sku}": ids("GET", "/stock/%s", ""),
		// the services' platform (both)
		"GET /healthz": nil, "GET /readyz": nil, "GET /stats": nil, "GET /metrics": nil,
		// in a failpoint build only (the system's; a default build answers
		// 404, TestCrashRoute)
		"POST /debug/crash": {{name: "unknown window", method: "POST", path: "/debug/crash?window=rm%20-rf"}, {name: "no window", method: "POST", path: "/debug/crash"},
			{name: "window not text", method: "POST", path: "/debug/crash?window=%FF%00"}},
		"DELETE /debug/crash": {{name: "unknown window", method: "DELETE", path: "/debug/crash?window=rm%20-rf"}, {name: "no window", method: "DELETE", path: "/debug/crash"}},
		// the payment provider
		"POST /v1/refunds": bodies("POST", "/v1/refunds", `{"capture":"cap_1","capture":"cap_2"}`, `{"Capture":"cap_1"}`,
			`{"capture":"cap_1","amount":0}`, `{"capture":"cap_1","amount":null}`, `{"capture":"cap_\u0000"}`, `{"capture":"cap_1","reason":"a\nb"}`),
		"GET /v1/refunds": {{name: "neither", method: "GET", path: "/v1/refunds"}, {name: "both", method: "GET", path: "/v1/refunds?capture=cap_1&reference=o"},
			{name: "capture not text", method: "GET", path: "/v1/refunds?capture=%FF%00"}, {name: "reference not text", method: "GET", path: "/v1/refunds?reference=%FF%00"}},
		"GET /v1/refunds/{id}": {{name: "not text", method: "GET", path: "/v1/refunds/%FF"}, {name: "NUL", method: "GET", path: "/v1/refunds/a%00b"},
			{name: "long", method: "GET", path: "/v1/refunds/" + strings.Repeat("r", 3000)}, {name: "unknown", method: "GET", path: "/v1/refunds/re_nope"}},
		"POST /v1/captures": bodies("POST", "/v1/captures", `{"amount":1,"amount":2,"currency":"eur","reference":"o","source":"tok_visa"}`,
			`{"Amount":1,"currency":"eur","reference":"o","source":"tok_visa"}`),
		"GET /v1/captures": {{name: "no reference", method: "GET", path: "/v1/captures"}, {name: "reference not text", method: "GET", path: "/v1/captures?reference=%FF%00"}},
		"GET /v1/captures/{id}": {{name: "not text", method: "GET", path: "/v1/captures/%FF"}, {name: "NUL", method: "GET", path: "/v1/captures/a%00b"},
			{name: "long", method: "GET", path: "/v1/captures/" + strings.Repeat("c", 3000)}, {name: "unknown", method: "GET", path: "/v1/captures/cap_nope"}},
		"GET /v1/ledger": {{name: "limit", method: "GET", path: "/v1/ledger?limit=x"}, {name: "limit 0", method: "GET", path: "/v1/ledger?limit=0"},
			{name: "after not text", method: "GET", path: "/v1/ledger?starting_after=%FF"}, {name: "after unknown", method: "GET", path: "/v1/ledger?starting_after=cap_nope"}},
		// the auditor (its /healthz, /readyz and /metrics are the platform's patterns)
		"GET /findings": {{name: "limit not a number", method: "GET", path: "/findings?limit=x"}, {name: "limit 0", method: "GET", path: "/findings?limit=0"},
			{name: "limit huge", method: "GET", path: "/findings?limit=99999999999999999999"}, {name: "unknown check", method: "GET", path: "/findings?check=payments"},
			{name: "check not text", method: "GET", path: "/findings?check=%FF%00"}, {name: "check sql", method: "GET", path: "/findings?check=" + url.QueryEscape("' OR 1=1 --")}},
		"GET /status": nil,
		// the live page
		"GET /{$}": nil, "GET /snapshot.json": nil, "GET /events": nil, "GET /flow.js": nil, "GET /recent.json": nil,
		"GET /journey.json": {{name: "not an id", method: "GET", path: "/journey.json?order=%FF"}, {name: "none", method: "GET", path: "/journey.json"},
			{name: "sql", method: "GET", path: "/journey.json?order=" + url.QueryEscape("' OR 1=1 --")}},
		"POST /crash": {{name: "no crasher", method: "POST", path: "/crash", body: `{"window":"before-begin"}`, header: map[string]string{"X-Crash-It-Now": "1"}}},
	}
}

// TestNoRouteAnswers5xx walks every route of the orders and inventory
// services, the payment provider, the auditor and the live page, as real processes and
// servers, with the malformed requests of routes() and, for each, an
// unknown Host (and for state-changing routes a cross-site request and a
// body that is not JSON): each must get a 4xx with a JSON reason, never a
// 5xx. Before, an id spelled urn:uuid:…, a path that is not text and a
// stock update naming one SKU twice got 500s.
func TestNoRouteAnswers5xx(t *testing.T) {
	t.Parallel()
	b := setup(t, system.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dash, err := dashboard.Start(ctx, "127.0.0.1:0", dashboard.Options{Orders: b.sys.Pools["orders"], Inventory: b.sys.Pools["inventory"]})
	require.NoError(t, err)
	servers := map[string][]string{ // route prefix → the servers that serve it
		"orders":    {"http://" + b.sys.Procs["orders"][0].Addr},
		"inventory": {"http://" + b.sys.Procs["inventory"][0].Addr},
		"platform":  {"http://" + b.sys.Procs["orders"][0].Addr, "http://" + b.sys.Procs["inventory"][0].Addr, "http://" + b.sys.Auditor.Addr},
		"auditor":   {"http://" + b.sys.Auditor.Addr},
		"provider":  {"http://" + b.sys.Provider.Addr},
		"dashboard": {strings.TrimSuffix(dash, "/")},
	}
	serverOf := func(pattern string) string {
		_, path, _ := strings.Cut(pattern, " ")
		switch {
		case strings.HasPrefix(path, "/orders"):
			return "orders"
		case strings.HasPrefix(path, "/stock"):
			return "inventory"
		case strings.HasPrefix(path, "/v1/"):
			return "provider"
		case path == "/findings" || path == "/status":
			return "auditor"
		case slices.Contains([]string{"/healthz", "/readyz", "/stats", "/metrics", "/debug/crash"}, path):
			return "platform"
		}
		return "dashboard"
	}
	client := &http.Client{Timeout: 40 * time.Second}
	tried := 0
	for pattern, reqs := range routes() {
		method, path, _ := strings.Cut(pattern, " ")
		path = strings.NewReplacer("{id}", uuid.NewString(), "{sku}", "sku-00", "{$}", "").Replace(path)
		common := []bad{{name: "unknown host", method: method, path: path, header: map[string]string{"Host": "attacker.example"}}}
		if method != http.MethodGet {
			common = append(common,
				bad{name: "cross-site", method: method, path: path, body: `{}`, header: map[string]string{"Sec-Fetch-Site": "cross-site", "X-Crash-It-Now": "1"}},
				bad{name: "form", method: method, path: path, body: "a=b", ctype: "application/x-www-form-urlencoded"},
				bad{name: "text", method: method, path: path, body: `{}`, ctype: "text/plain"})
		}
		for _, base := range servers[serverOf(pattern)] {
			for _, r := range append(common, reqs...) {
				tried++
				req, err := http.NewRequest(r.method, base+r.path, strings.NewReader(r.body))
				require.NoError(t, err, "%s %s", pattern, r.name)
				if r.body != "" {
					req.Header.Set("Content-Type", cmpOr(r.ctype, "application/json"))
				}
				for k, v := range r.header {
					if k == "Host" {
						req.Host = v
						continue
					}
					req.Header.Set(k, v)
				}
				resp, err := client.Do(req)
				require.NoError(t, err, "%s: %s", pattern, r.name)
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				require.True(t, resp.StatusCode >= 400 && resp.StatusCode < 500, "%s (%s %s at %s): %d %s", pattern, r.name, r.path[:min(len(r.path), 80)], base, resp.StatusCode, body)
				if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
					var reason map[string]any
					require.NoError(t, json.Unmarshal(body, &reason), "%s: %s: %s", pattern, r.name, body)
					require.NotEmpty(t, reason["error"], "%s: %s: no reason in %s", pattern, r.name, body)
				}
			}
		}
	}
	t.Logf("%d malformed requests to %d routes, each answered 4xx", tried, len(routes()))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestRouteTableIsComplete: every route the servers register (a HandleFunc
// or Handle pattern in their source) has its entry in routes(), so a new
// route cannot escape TestNoRouteAnswers5xx.
func TestRouteTableIsComplete(t *testing.T) {
	t.Parallel()
	table := routes()
	var registered []string
	for _, dir := range []string{"../../services", "../provider", "../../dashboard"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle" {
					return true
				}
				if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					p, _ := strconv.Unquote(lit.Value)
					registered = append(registered, p)
				}
				return true
			})
			return nil
		})
		require.NoError(t, err)
	}
	require.Greater(t, len(registered), 20, "the scan found too few routes to mean anything")
	for _, p := range registered {
		if strings.HasPrefix(p, "/debug/pprof/") {
			continue // DEBUG_PPROF only, off by default; Go's own handlers
		}
		_, ok := table[p]
		require.True(t, ok, "route %q is served but not in routes(): add its malformed requests", p)
	}
}
