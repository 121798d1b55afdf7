package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// TestServe: GET /findings names what is wrong, GET /metrics exports every
// audit metric the alerting rules use (a kind with nothing open as 0, so
// an alert resolves), and bad parameters get a 400 with the reason.
func TestServe(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.healthy()
	id := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "rejected"})
	w.round(w.auditor(time.Minute))
	srv := httptest.NewServer(handler(w.state, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	code, body := get("/findings")
	require.Equal(t, http.StatusOK, code, body)
	var got struct{ Findings []findingJSON }
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Len(t, got.Findings, 1)
	require.Equal(t, []string{"orders", id, KindAnswersDisagree}, []string{got.Findings[0].Check, got.Findings[0].Entity, got.Findings[0].Kind})
	require.Equal(t, "orders says reserved (payment captured); inventory decided rejected", got.Findings[0].Detail)
	require.Nil(t, got.Findings[0].ResolvedAt)

	code, metrics := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, `audit_findings_open{check="orders",kind="answers-disagree"} 1`)
	require.Contains(t, metrics, `audit_findings_open{check="stock",kind="stock-out-of-balance"} 0`)
	require.Contains(t, metrics, `audit_examined_total{check="orders"} 5`)
	rules, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	used := regexp.MustCompile(`\baudit_[a-z_]+`).FindAllString(string(rules), -1)
	require.NotEmpty(t, used)
	for _, name := range used {
		require.Truef(t, strings.Contains(metrics, "\n"+name+"{"), "alerts.yml uses %s, which the auditor does not serve", name)
	}

	for path, reason := range map[string]string{
		"/findings?limit=0":        "limit",
		"/findings?limit=x":        "limit",
		"/findings?check=payments": "check: one of",
	} {
		code, body := get(path)
		require.Equal(t, http.StatusBadRequest, code, path)
		require.Contains(t, body, reason, path)
	}
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code)
}

// TestChaosJudgesTheseKinds: the chaos judge's rule (judge.AuditAlarms)
// names kinds of this auditor's as lateness, and pages at the lateness
// production's alert pages at: the default grace period, then the `for`
// of AuditFindingOpen.
func TestChaosJudgesTheseKinds(t *testing.T) {
	t.Parallel()
	var known []string
	for _, ks := range kinds {
		known = append(known, ks...)
	}
	for _, k := range judge.LatenessKinds {
		require.Contains(t, known, k, "judge.LatenessKinds names a kind the auditor does not have")
	}
	require.True(t, strings.HasSuffix(refundReason, judge.RepairMark), "the judge knows a refund the auditor asked for by its reason")
	rules, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)alert: AuditFindingOpen\n.*?\n\s+for: (\S+)`).FindSubmatch(rules)
	require.NotNil(t, m, "AuditFindingOpen's for")
	d, err := time.ParseDuration(string(m[1]))
	require.NoError(t, err)
	require.Equal(t, judge.AlarmLateness, audit.GraceDefault+d)
}
