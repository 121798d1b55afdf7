package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/stretchr/testify/require"
)

// BenchmarkFailureGroups: the console's reads over a quarantine of a million
// open messages in 21 groups (a bad deploy's 1,000 among twenty groups of
// ~50,000), beside the grouping done without migration 007's stored
// failure_group (masking every reason at read time), in one run:
//
//   - Groups: ListGroups, an index-only scan of the groups index;
//   - GroupsMaskedAtRead: the same groups from the reasons themselves;
//   - Page: a page of 50 of the bad deploy's messages, by keyset, the 20th;
//   - DryRun: counting the bad deploy's messages for a bulk action.
//
// Reported: ms per read.
//
//	go test ./pkg/inbox -run '^$' -bench BenchmarkFailureGroups -benchtime 5x -timeout 30m
func BenchmarkFailureGroups(b *testing.B) {
	const rows = 1_000_000
	ctx := context.Background()
	pool := newTestDB(b, ctx)
	_, err := pool.Exec(ctx, `
		INSERT INTO inbox_quarantine (consumer, message_id, kind, reason, attempts, topic, payload_sha256, payload, metadata)
		SELECT $1, gen_random_uuid()::text, 'dead_letter',
			CASE WHEN n % 1000 = 0 THEN format('handler: order %s: amount %s above the limit', gen_random_uuid(), n)
			     ELSE format('handler: dependency %s failed: timeout after %sms', chr(97 + n % 20), n % 997) END,
			5, 'payments', '\x00', '{}', jsonb_build_object('event_type', 'PaymentCaptured')
		FROM generate_series(1, $2::int) AS n`, consumer, rows)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE inbox_quarantine`)
	require.NoError(b, err)
	groups, err := inboxadmin.New(pool).ListGroups(ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(b, err)
	require.Len(b, groups, 21)
	deploy := groups[len(groups)-1] // the smallest
	require.EqualValues(b, 1000, deploy.Count)

	timed := func(name string, read func() error) {
		b.Run(name, func(b *testing.B) {
			var took time.Duration
			for range b.N {
				start := time.Now()
				require.NoError(b, read())
				took += time.Since(start)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(took.Microseconds())/1000/float64(b.N), "ms/read")
		})
	}
	timed("Groups", func() error {
		_, err := inboxadmin.New(pool).ListGroups(ctx, inboxadmin.GroupFilter{Consumer: consumer})
		return err
	})
	timed("GroupsMaskedAtRead", func() error {
		_, err := pool.Exec(ctx, `SELECT kind, inbox_reason_pattern(reason), metadata->>'event_type', metadata->>'signature_key_id',
			count(*), min(created_at), max(created_at)
			FROM inbox_quarantine WHERE consumer = $1 AND resolved_at IS NULL GROUP BY 1, 2, 3, 4`, consumer)
		return err
	})
	page, err := inboxadmin.New(pool).ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: consumer, Group: deploy.ID, Limit: 950})
	require.NoError(b, err)
	timed("Page", func() error {
		list, err := inboxadmin.New(pool).ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: consumer, Group: deploy.ID, After: page[len(page)-1].ID, Limit: 50})
		if err == nil && len(list) != 50 {
			b.Fatalf("a page of %d", len(list))
		}
		return err
	})
	timed("DryRun", func() error {
		plan, err := inboxadmin.New(pool).DryRun(ctx, inboxadmin.Selection{Consumer: consumer, Group: deploy.ID})
		if err == nil && plan.Count != 1000 {
			b.Fatalf("counted %d", plan.Count)
		}
		return err
	})
}
