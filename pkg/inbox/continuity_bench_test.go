package inbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// BenchmarkContinuityPrice: what checking each key's history costs a
// delivery (continuity.go: one more statement in its transaction), side by
// side in one run: the same deliveries through the middleware, one message
// per transaction with fsync on, numbered (the state of 1,000 keys read,
// compared and moved) and not. Reported: deliveries per second; the price
// is the ratio.
//
//	go test ./inbox -run '^$' -bench BenchmarkContinuityPrice -count 5
func BenchmarkContinuityPrice(b *testing.B) {
	const keys = 1000
	stream := uuid.NewString()
	for _, numbered := range []bool{false, true} {
		b.Run(fmt.Sprint("Numbered=", numbered), func(b *testing.B) {
			ctx := context.Background()
			pool := newTestDB(b, ctx)
			in, err := inbox.New(inbox.Config{Pool: pool, Consumer: consumer})
			require.NoError(b, err)
			mw := in.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
			next := map[int]int{}
			n := 0
			for b.Loop() {
				msg := message.NewMessage(uuid.NewString(), []byte(`{"n":1}`))
				key := n % keys
				msg.Metadata.Set(outbox.KeyMetadata, fmt.Sprint("key-", key))
				if numbered {
					next[key]++
					msg.Metadata.Set(outbox.SequenceMetadata, fmt.Sprintf("%s:%d", stream, next[key]))
				}
				msg.SetContext(ctx)
				if _, err := mw(msg); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "deliveries/s")
			counts, err := inboxadmin.New(pool).Continuity(ctx, consumer)
			require.NoError(b, err)
			require.Zero(b, counts.Gaps+counts.Rewinds, "the benchmark's histories broke")
		})
	}
}
