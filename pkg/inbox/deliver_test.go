package inbox_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
)

// TestDeliverWithoutTheRouter: a consumer that reads Kafka with a client of
// its own hands each record to Deliver with its topic. The inbox
// deduplicates as under the router, and knows the topic a message came from,
// so its dead letter can be redriven there (with the topic unknown, the
// redrive is refused: ErrNotRedrivable).
func TestDeliverWithoutTheRouter(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{MaxAttempts: 1})
	const topic = "orders.events"
	record := func(id string) *message.Message { return message.NewMessage(id, []byte("paid")) }

	id := newID()
	require.NoError(t, in.Deliver(b.ctx, topic, record(id), b.handler.handle))
	require.NoError(t, in.Deliver(b.ctx, topic, record(id), b.handler.handle))
	require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(id))
	require.Equal(t, 1, appliedRows(t, b, consumer, id), "a copy was applied again")
	require.Equal(t, topic, scalar[string](t, b, `SELECT topic FROM inbox_messages WHERE message_id = $1`, id))

	poison := newID()
	fail := func(*message.Message) ([]*message.Message, error) {
		return nil, inbox.Permanent(errors.New("schema v2"))
	}
	require.NoError(t, in.Deliver(b.ctx, topic, record(poison), fail))
	require.Equal(t, []inbox.Outcome{inbox.DeadLettered}, b.events.outcomes(poison))
	dead, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	res, err := inboxadmin.New(b.pool).Retry(b.ctx, dead[0].ID, "alice")
	require.NoError(t, err, "a dead letter Deliver recorded must be redrivable to its topic")
	require.True(t, res.Redriven, res.Note)
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND message_id = $2::uuid`, topic, poison))

	require.ErrorContains(t, in.Deliver(b.ctx, "", record(newID()), b.handler.handle), "topic")
}
