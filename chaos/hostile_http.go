package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outbox-inbox/chaos/judge"
)

// hostileRequest is one hostile HTTP class: a request the services must
// refuse with a 4xx and a reason, whichever replica answers, while they are
// killed and restarted around it.
type hostileRequest struct {
	class, service, method, path, body, ctype string
	header                                    map[string]string
}

// hostileRequests are the classes of #31 that arrive over HTTP: an id in a
// spelling Postgres does not take, a path that is not text, a stock update
// naming one SKU twice, JSON a lax reader reads otherwise, a page of another
// site posting, a form, a Host nobody named (DNS rebinding).
func hostileRequests() []hostileRequest {
	order := `{"lines":[{"sku":"sku-01","quantity":1}]}`
	return []hostileRequest{
		{class: "http_id_noncanonical", service: "orders", method: "GET", path: "/orders/urn:uuid:" + uuid.NewString()},
		{class: "http_retry_id_noncanonical", service: "orders", method: "POST", path: "/orders/urn:uuid:" + uuid.NewString() + "/payment/retry"},
		{class: "http_path_not_text", service: "inventory", method: "GET", path: "/stock/%FF%00"},
		{class: "http_sku_twice", service: "inventory", method: "PUT", path: "/stock", body: `[{"sku":"sku-01","available":1},{"sku":"sku-01","available":2}]`},
		{class: "http_json_key_twice", service: "orders", method: "POST", path: "/orders", body: `{"lines":[{"sku":"sku-01","quantity":1}],"lines":[{"sku":"sku-02","quantity":9}]}`},
		{class: "http_json_key_case", service: "orders", method: "POST", path: "/orders", body: `{"Lines":[{"sku":"sku-01","quantity":1}]}`},
		{class: "http_cross_site", service: "orders", method: "POST", path: "/orders", body: order, header: map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{class: "http_form", service: "orders", method: "POST", path: "/orders", body: order, ctype: "application/x-www-form-urlencoded"},
		{class: "http_unknown_host", service: "inventory", method: "GET", path: "/stock", header: map[string]string{"Host": "rebound.attacker.example"}},
	}
}

// httpResults holds each HTTP class's outcome once sendHTTP ran.
type httpResults struct {
	mu  sync.Mutex
	out map[string]judge.HostileResult
}

// sendHTTP sends every hostile request, each to a replica of its service
// (retried on another while a killed one does not answer), and records
// whether it got a 4xx with a JSON reason.
func (h *hostile) sendHTTP(ctx context.Context) {
	client := &http.Client{Timeout: 10 * time.Second}
	bases := map[string][]string{"orders": h.sys.Client.Orders, "inventory": h.sys.Client.Inventory}
	h.http.mu.Lock()
	defer h.http.mu.Unlock()
	h.http.out = map[string]judge.HostileResult{}
	for _, r := range hostileRequests() {
		status, reason, err := h.tryHTTP(ctx, client, bases[r.service], r)
		h.http.out[r.class] = judge.HTTPOutcome(status, reason, err)
	}
}

// tryHTTP sends r until a replica answers (a killed one refuses the
// connection; the harness restarts it), for up to a minute. An answer of
// 5xx is tried again too: the run's own faults (a Postgres that is down or
// cut off) make a replica answer 500 to a request it would refuse with a
// 4xx a moment later, and a request refused by a fault says nothing about
// hostile input. One that keeps answering 5xx for the minute is returned
// as it answered, and fails its class (judge.HTTPOutcome).
func (h *hostile) tryHTTP(ctx context.Context, client *http.Client, bases []string, r hostileRequest) (int, string, error) {
	deadline := time.Now().Add(time.Minute)
	var last error
	status, reason := 0, ""
	for i := 0; time.Now().Before(deadline); i++ {
		if status >= 500 {
			select {
			case <-ctx.Done():
				return 0, "", ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
		base := bases[i%len(bases)]
		req, err := http.NewRequestWithContext(ctx, r.method, base+r.path, strings.NewReader(r.body))
		if err != nil {
			return 0, "", err
		}
		if r.body != "" {
			req.Header.Set("Content-Type", cmpOr(r.ctype, "application/json"))
		}
		for k, v := range r.header {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err
			select {
			case <-ctx.Done():
				return 0, "", ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		var answer struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(body, &answer)
		if status, reason = resp.StatusCode, answer.Error; status < 500 {
			return status, reason, nil
		}
	}
	if status >= 500 {
		return status, reason, nil
	}
	return 0, "", errors.Join(errors.New("no replica answered within a minute"), last)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
