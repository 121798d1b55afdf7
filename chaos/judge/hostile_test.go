package judge_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
)

// TestHostileOutcome: a hostile class is handled only when its consumer's
// database holds what it must end as: the right kind, its own payload, a
// reason that says what it must, every delivery accounted for; a refusal
// by the guard with a reason; a broker refusal for authorization with no
// trace of the id behind it; a 4xx with a reason.
func TestHostileOutcome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := serviceDatabase(t, ctx, "inventory")
	quarantine := func(id, kind, reason string, payload []byte) {
		sum := sha256.Sum256(payload)
		_, err := pool.Exec(ctx, `INSERT INTO inbox_quarantine (consumer, message_id, kind, reason, payload_sha256, payload) VALUES ('inventory', $1, $2, $3, $4, $5)`,
			id, kind, reason, sum[:], payload)
		require.NoError(t, err)
	}
	msg := func(id, kind, reason string, times int) judge.HostileMessage {
		return judge.HostileMessage{Class: id, Consumer: "inventory", ID: id, RecordedAs: id, Kind: kind, Reason: reason,
			Payload: []byte("payload of " + id), Times: times}
	}
	quarantine("dl", "dead_letter", "permanent error: invalid event: not valid UTF-8", []byte("payload of dl"))
	quarantine("wrong-kind", "invalid", "permanent error: invalid event", []byte("payload of wrong-kind"))
	quarantine("other-payload", "dead_letter", "permanent error: invalid event", []byte("another payload"))
	quarantine("no-reason-match", "dead_letter", "permanent error: something else", []byte("payload of no-reason-match"))
	_, err := pool.Exec(ctx, `INSERT INTO refusals (order_id, message_id, reason) VALUES ('o-1', 'refused', 'not a paid order')`)
	require.NoError(t, err)

	for _, c := range []struct {
		m       judge.HostileMessage
		handled bool
	}{
		{msg("dl", "dead_letter", "not valid UTF-8", 1), true},
		{msg("dl", "dead_letter", "not valid UTF-8", 2), false}, // a second delivery neither quarantined nor suppressed
		{msg("wrong-kind", "dead_letter", "", 1), false},
		{msg("other-payload", "dead_letter", "", 1), false},
		{msg("no-reason-match", "dead_letter", "not valid UTF-8", 1), false},
		{msg("never-seen", "dead_letter", "", 1), false},
		{msg("refused", judge.KindRefused, "", 1), true},
		{msg("refused", judge.KindRefused, "", 2), false},
		{msg("dl", judge.KindRefused, "", 1), false},
	} {
		r, err := judge.HostileOutcome(ctx, pool, c.m)
		require.NoError(t, err)
		if r.Handled != c.handled {
			t.Errorf("%s as %s ×%d: handled %t, want %t (%+v)", c.m.ID, c.m.Kind, c.m.Times, r.Handled, c.handled, r)
		}
	}

	denied := fmt.Errorf("produce: %w", sarama.ErrTopicAuthorizationFailed)
	broker := msg("intruder", judge.KindBrokerRefused, "", 1)
	for _, c := range []struct {
		name    string
		m       judge.HostileMessage
		sent    bool
		refusal error
		handled bool
	}{
		{"refused for authorization", broker, true, denied, true},
		{"never tried", broker, false, nil, false},
		{"accepted", broker, true, nil, false},
		{"refused for another reason", broker, true, errors.New("broker down"), false},
		{"refused, yet its id is in the consumer", msg("refused", judge.KindBrokerRefused, "", 1), true, denied, false},
	} {
		r, err := judge.BrokerRefusedOutcome(ctx, pool, c.m, c.sent, c.refusal)
		require.NoError(t, err)
		if r.Handled != c.handled {
			t.Errorf("%s: handled %t, want %t (%s)", c.name, r.Handled, c.handled, r.Reason)
		}
	}

	for _, c := range []struct {
		status  int
		reason  string
		err     error
		handled bool
	}{
		{400, "invalid JSON", nil, true},
		{400, "", nil, false},
		{500, "internal", nil, false},
		{200, "", nil, false},
		{0, "", errors.New("no replica answered"), false},
	} {
		if r := judge.HTTPOutcome(c.status, c.reason, c.err); r.Handled != c.handled {
			t.Errorf("HTTP %d %q %v: handled %t, want %t", c.status, c.reason, c.err, r.Handled, c.handled)
		}
	}
}
