package platform

import (
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestMetrics pays three orders, has one OrderPaid delivered twice, and
// reads both services' GET /metrics.
func TestMetrics(t *testing.T) {
	t.Parallel()
	p := setup(t)
	ids := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	for _, id := range ids {
		p.pay(t, id)
	}
	for _, id := range ids {
		eventually(t, p.ctx, func() bool { return p.status(t, id) == "reserved" }, "order "+id+" to be reserved")
	}
	p.republishOrderPaid(t, ids[0])
	eventually(t, p.ctx, func() bool { return p.duplicates(t) == 1 }, "the redelivery to be suppressed")

	inv := scrape(t, p.invAddr)
	series := func(name, outcome string) string {
		return fmt.Sprintf(`%s{consumer="%s",outcome="%s"}`, name, p.inventory, outcome)
	}
	require.Equal(t, 3.0, metric(t, inv, series(metricInboxMessages, "applied")), inv)
	require.Equal(t, 1.0, metric(t, inv, series(metricInboxMessages, "duplicate")))
	require.Equal(t, 0.0, metric(t, inv, series(metricInboxMessages, "dead_lettered")))
	require.Equal(t, 3.0, metric(t, inv, series(metricHandlerDuration+"_count", "applied")))
	require.Equal(t, 1.0, metric(t, inv, series(metricHandlerDuration+"_count", "duplicate")))
	lag := fmt.Sprintf(`%s_count{consumer="%s"}`, metricCommitToApply, p.inventory)
	require.Equal(t, 3.0, metric(t, inv, lag), "one commit-to-apply sample per applied message, none for the duplicate")
	require.Positive(t, metric(t, inv, fmt.Sprintf(`%s_sum{consumer="%s"}`, metricCommitToApply, p.inventory)))
	require.Equal(t, 3.0, metric(t, inv, metricRelayed), "three answers published")
	require.Equal(t, 1.0, metric(t, inv, metricPrimaryUp), "its database answers as the primary")
	require.Equal(t, 0.0, metric(t, inv, metricStandbyWaiting), "no DATABASE_STANDBYS: nothing waits")
	require.Equal(t, 0.0, metric(t, inv, metricRelayErrors))
	require.Equal(t, 0.0, metric(t, inv, metricPendingRows))
	require.Equal(t, 0.0, metric(t, inv, metricOldestPendingAge))
	require.Equal(t, 0.0, metric(t, inv, metricParkedRows))
	require.Equal(t, 0.0, metric(t, inv, metricRelayParked))

	// The relay counts a batch after marking it published, which can be after
	// the consumer already suppressed the copy.
	eventually(t, p.ctx, func() bool { return metric(t, scrape(t, p.ordersAddr), metricRelayed) == 4 }, "three OrderPaid relayed, one of them twice")
	ord := scrape(t, p.ordersAddr)
	require.Equal(t, 3.0, metric(t, ord, fmt.Sprintf(`%s{consumer="%s",outcome="applied"}`, metricInboxMessages, p.orders)))
	require.Equal(t, 3.0, metric(t, ord, fmt.Sprintf(`%s_count{consumer="%s"}`, metricCommitToApply, p.orders)))
	require.Positive(t, metric(t, ord, "go_goroutines"))
}

// TestOutboxBacklogMetrics reads the backlog gauges from a database whose
// rows no relay publishes.
func TestOutboxBacklogMetrics(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, err := pg.CreateDatabase(ctx, "platform_backlog_"+uuid.NewString()[:8])
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(ctx, pool))
	m := newMetrics(pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	get := func() string {
		rec := httptest.NewRecorder()
		m.handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}

	text := get()
	require.Equal(t, 0.0, metric(t, text, metricPendingRows), text)
	require.Equal(t, 0.0, metric(t, text, metricOldestPendingAge))

	_, err = pool.Exec(ctx, `
		INSERT INTO outbox_messages (message_id, topic, payload, created_at, published_at) VALUES
			(gen_random_uuid(), 't', '', now() - interval '90 seconds', NULL),
			(gen_random_uuid(), 't', '', now() - interval '10 seconds', NULL),
			(gen_random_uuid(), 't', '', now() - interval '1 hour', now())`)
	require.NoError(t, err)
	text = get()
	require.Equal(t, 2.0, metric(t, text, metricPendingRows), "published rows do not count")
	age := metric(t, text, metricOldestPendingAge)
	require.GreaterOrEqual(t, age, 90.0)
	require.Less(t, age, 120.0)
	require.Equal(t, 0.0, metric(t, text, metricPendingQueryErrors))

	// An unreachable database leaves the gauges out and counts the error;
	// the rest of the scrape is still served.
	pool.Close()
	text = get()
	require.Equal(t, -1.0, metric(t, text, metricPendingRows), text)
	require.Equal(t, 1.0, metric(t, text, metricPendingQueryErrors))
	require.Positive(t, metric(t, text, "go_goroutines"))
}

// metricName matches a PromQL metric name of this project's (recording
// rules, with a colon, are names of their own and not matched).
var metricName = regexp.MustCompile(`\b(?:inbox|outbox)_[a-z0-9_]+\b|\bup\b`)

// TestRulesUseExportedMetrics: every metric the alerting rules
// (deploy/prometheus/alerts.yml) and the Grafana dashboard
// (deploy/grafana/dashboards/outbox-inbox.json) use is served by a running
// service's GET /metrics, after one order went through: a renamed metric
// would leave an alert that can never fire.
func TestRulesUseExportedMetrics(t *testing.T) {
	t.Parallel()
	p := setup(t)
	id := uuid.NewString()
	p.pay(t, id)
	eventually(t, p.ctx, func() bool { return p.status(t, id) == "reserved" }, "order "+id+" to be reserved")
	served := scrape(t, p.ordersAddr) + scrape(t, p.invAddr)

	for _, file := range []string{"../../../deploy/prometheus/alerts.yml", "../../../deploy/grafana/dashboards/outbox-inbox.json"} {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		names := usedMetrics(string(raw))
		require.GreaterOrEqual(t, len(names), 5, "%s: found only %v", file, names)
		for _, name := range names {
			if name == "up" {
				continue // Prometheus's own, per scrape target
			}
			require.Truef(t, serves(served, name), "%s uses %s, which no service serves", file, name)
		}
	}
	require.False(t, serves(served, "outbox_renamed_rows"), "the check must see a metric no service serves")
}

// usedMetrics returns the distinct metric names of this project's in text,
// PromQL in YAML or JSON.
func usedMetrics(text string) []string {
	var names []string
	for _, m := range metricName.FindAllStringIndex(text, -1) {
		name := text[m[0]:m[1]]
		if m[1] < len(text) && text[m[1]] == ':' || m[0] > 0 && text[m[0]-1] == ':' {
			continue // part of a recording rule's name
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// serves reports whether the /metrics text has a sample of name.
func serves(text, name string) bool {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			return true
		}
	}
	return false
}
