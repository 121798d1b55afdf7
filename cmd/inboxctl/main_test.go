package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

var (
	pg  *pgtest.Server
	kfk *stack.Kafka
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if pg, err = pgtest.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "inboxctl tests:", err)
		return 1
	}
	defer pg.Stop() //nolint:errcheck
	if kfk, err = stack.StartKafka(ctx, stack.KafkaOptions{Partitions: 1}); err != nil {
		fmt.Fprintln(os.Stderr, "inboxctl tests:", err)
		return 1
	}
	defer kfk.Close()
	return m.Run()
}

type testBundle struct {
	ctx  context.Context
	url  string
	pool *pgxpool.Pool
	pub  message.Publisher
	// topic is consumed by consumer "billing", whose handler refuses
	// every payload starting with "bad".
	topic string
}

func setup(t *testing.T) *testBundle { return setupPolicy(t, inbox.SkipKey) }

// setupPolicy is setup with the consumer's Config.OnDeadLetter.
func setupPolicy(t *testing.T, policy inbox.DeadLetterPolicy) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	suffix := strings.ToLower(watermill.NewShortUUID())
	b := &testBundle{ctx: ctx, topic: "inboxctl-" + suffix}
	var err error
	b.url, err = pg.CreateDatabase(ctx, "inboxctl_"+suffix)
	require.NoError(t, err)
	b.pool, err = pgxpool.New(ctx, b.url)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	require.NoError(t, inbox.Migrate(ctx, b.pool))
	require.NoError(t, outbox.Migrate(ctx, b.pool))

	require.NoError(t, kfk.CreateTopics(ctx, 1, b.topic))
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: kfk.Brokers(), Unmarshaler: marshaler, OverwriteSaramaConfig: kafkaconf.Sarama(), ConsumerGroup: b.topic,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	b.pub, err = kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kfk.Brokers(), Marshaler: marshaler, OverwriteSaramaConfig: kafkaconf.Sarama(),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.pub.Close() })
	in, err := inbox.New(inbox.Config{Pool: b.pool, Consumer: "billing", OnDeadLetter: policy})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddConsumerHandler("billing", b.topic, sub, func(msg *message.Message) error {
		if bytes.HasPrefix(msg.Payload, []byte("bad")) {
			return inbox.Permanent(errors.New("amount is not a number"))
		}
		return nil
	}).AddMiddleware(in.Middleware)
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
	})
	<-router.Running()
	return b
}

// deadLetter publishes a payload the handler refuses and waits until it
// is dead-lettered; it returns the quarantine row's id.
func (b *testBundle) deadLetter(t *testing.T, payload string) (int64, string) {
	t.Helper()
	msg := outbox.NewMessage("account-1", []byte(payload))
	require.NoError(t, b.pub.Publish(b.topic, msg))
	var id int64
	for {
		err := b.pool.QueryRow(b.ctx, `SELECT id FROM inbox_quarantine WHERE message_id = $1`, msg.UUID).Scan(&id)
		if err == nil {
			return id, msg.UUID
		}
		select {
		case <-b.ctx.Done():
			t.Fatalf("%s was not dead-lettered: %v", payload, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ctl runs inboxctl with args against the bundle's database.
func (b *testBundle) ctl(args ...string) (string, error) {
	var out bytes.Buffer
	err := run(b.ctx, args, &out, func(k string) string {
		if k == "DATABASE_URL" {
			return b.url
		}
		return ""
	})
	return out.String(), err
}

func TestInboxctl(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, firstMsg := b.deadLetter(t, "bad: forty-two")
	second, _ := b.deadLetter(t, "bad: NaN")
	id1, id2 := fmt.Sprint(first), fmt.Sprint(second)

	out, err := b.ctl("list", "-consumer", "billing", "-kind", "dead_letter")
	require.NoError(t, err)
	require.Contains(t, out, "REASON")
	require.Contains(t, out, firstMsg)
	require.Contains(t, out, "permanent error: amount is not a number")
	require.Equal(t, 3, strings.Count(out, "\n"), "a header and two rows:\n%s", out)

	out, err = b.ctl("show", id1)
	require.NoError(t, err)
	require.Contains(t, out, "bad: forty-two")
	require.Contains(t, out, "topic:")
	require.Contains(t, out, b.topic)
	require.Contains(t, out, "resolution:      open")

	out, err = b.ctl("redrive", "-by", "alice", id1)
	require.NoError(t, err)
	require.Contains(t, out, id1+" redriven: message "+firstMsg+" written back to "+b.topic)
	var redriven int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND message_id = $2`, b.topic, firstMsg).Scan(&redriven))
	require.Equal(t, 1, redriven, "written to the outbox")
	out, err = b.ctl("redrive", "-by", "bob", id1)
	require.NoError(t, err)
	require.Contains(t, out, id1+" not redriven: already redriven by alice")

	_, err = b.ctl("discard", "-by", "carol", id2)
	require.ErrorContains(t, err, "discard needs -why")
	out, err = b.ctl("discard", "-by", "carol", "-why", "test data from the load generator", id2)
	require.NoError(t, err)
	require.Contains(t, out, id2+" discarded by carol")

	out, err = b.ctl("list")
	require.NoError(t, err)
	require.Equal(t, "nothing quarantined\n", out)
	out, err = b.ctl("redrive", "-all", "-consumer", "billing")
	require.NoError(t, err)
	require.Equal(t, "no open message chosen: nothing to do\n", out)
	out, err = b.ctl("list", "-resolved")
	require.NoError(t, err)
	require.Contains(t, out, "redriven by alice")
	require.Contains(t, out, "discarded by carol")
}

// TestInboxctlBulk: dead letters that failed alike are one group; a redrive
// of the group counts it first, does nothing with a count other than the
// dry run's, and with it redrives each message once; the history shows it.
func TestInboxctlBulk(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []string
	for _, p := range []string{"bad: one", "bad: two", "bad: three"} {
		_, id := b.deadLetter(t, p)
		ids = append(ids, id)
	}
	out, err := b.ctl("groups")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, "a header and one group:\n%s", out)
	fields := strings.Fields(lines[1])
	group := fields[0]
	require.Equal(t, []string{"billing", "dead_letter", "3"}, fields[1:4])

	_, err = b.ctl("list", "-group", group)
	require.ErrorContains(t, err, "needs its Consumer")
	out, err = b.ctl("list", "-consumer", "billing", "-group", group)
	require.NoError(t, err)
	require.Equal(t, 4, strings.Count(out, "\n"), "a header and three rows:\n%s", out)

	out, err = b.ctl("redrive", "-group", group)
	require.ErrorContains(t, err, "-consumer NAME")
	out, err = b.ctl("redrive", "-by", "alice", "-consumer", "billing", "-group", group)
	require.NoError(t, err)
	dry := regexp.MustCompile(`^dry run: 3 open messages of billing chosen; nothing done. To redrive them: the same command with -expect 3 -up-to (\d+) -digest ([0-9a-f]{16})\n$`).FindStringSubmatch(out)
	require.NotNil(t, dry, out)
	_, err = b.ctl("redrive", "-by", "alice", "-consumer", "billing", "-group", group, "-expect", "3")
	require.ErrorContains(t, err, "-expect goes with the -up-to")
	_, err = b.ctl("redrive", "-by", "alice", "-consumer", "billing", "-group", group, "-expect", "2", "-up-to", dry[1])
	require.ErrorContains(t, err, "3 open messages chosen now, not the 2 expected")
	_, err = b.ctl("redrive", "-by", "alice", "-consumer", "billing", "-group", group, "-expect", "3", "-up-to", dry[1], "-digest", "0123456789abcdef")
	require.ErrorContains(t, err, "as expected, but not the same ones")
	_, late := b.deadLetter(t, "bad: four") // after the dry run: not part of it
	out, err = b.ctl("redrive", "-by", "alice", "-consumer", "billing", "-group", group, "-expect", "3", "-up-to", dry[1], "-digest", dry[2])
	require.NoError(t, err)
	require.Contains(t, out, "finished: 3 of 3 done, 0 skipped")
	for _, id := range ids {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND message_id = $2`, b.topic, id).Scan(&n))
		require.Equal(t, 1, n, "message %s written back", id)
	}
	out, err = b.ctl("redrive", "-by", "alice", "-consumer", "billing", "-group", group, "-expect", "3", "-up-to", dry[1])
	require.NoError(t, err)
	require.Equal(t, "no open message chosen: nothing to do\n", out)
	out, err = b.ctl("list", "-consumer", "billing", "-group", group)
	require.NoError(t, err)
	require.Contains(t, out, late, "the message quarantined after the dry run is open")
	require.Equal(t, 2, strings.Count(out, "\n"), "a header and one row:\n%s", out)

	out, err = b.ctl("actions")
	require.NoError(t, err)
	require.Contains(t, out, "retry")
	require.Contains(t, out, "alice")
	require.Contains(t, out, group)
	require.Equal(t, 2, strings.Count(out, "\n"), "a header and one action:\n%s", out)
	action := strings.Fields(strings.Split(out, "\n")[1])[0]
	out, err = b.ctl("action", action)
	require.NoError(t, err)
	require.Equal(t, 3, strings.Count(out, "\tdone\t")+strings.Count(out, "  done  "), "each message done:\n%s", out)
}

// TestInboxctlHeld: held lists a held key with its dead letter and what is
// parked behind it; discarding the dead letter releases it.
func TestInboxctlHeld(t *testing.T) {
	t.Parallel()
	b := setupPolicy(t, inbox.HoldKey)
	out, err := b.ctl("held")
	require.NoError(t, err)
	require.Equal(t, "no key held\n", out)

	first, firstMsg := b.deadLetter(t, "bad: forty-two")
	parked := outbox.NewMessage("account-1", []byte("good: 7"))
	require.NoError(t, b.pub.Publish(b.topic, parked))
	var status string
	for status != "parked" {
		require.NoError(t, b.ctx.Err(), "the message behind the dead letter was not parked")
		_ = b.pool.QueryRow(b.ctx, `SELECT status FROM inbox_messages WHERE message_id = $1`, parked.UUID).Scan(&status)
		time.Sleep(20 * time.Millisecond) // polling a condition
	}

	out, err = b.ctl("held", "-consumer", "billing")
	require.NoError(t, err)
	require.Contains(t, out, "DEAD LETTER")
	require.Regexp(t, `billing\s+`+b.topic+`\s+account-1\s+held\s+`+fmt.Sprint(first)+`\s+`+firstMsg+`\s+1\s`, out)
	require.Equal(t, 2, strings.Count(out, "\n"), "a header and one key:\n%s", out)

	_, err = b.ctl("discard", "-by", "carol", "-why", "test data", fmt.Sprint(first))
	require.NoError(t, err)
	out, err = b.ctl("held")
	require.NoError(t, err)
	require.Contains(t, out, "redriven", "the parked message was written back in the dead letter's place:\n%s", out)
	require.Contains(t, out, parked.UUID)
}

// TestInboxctlBreaches: breaches lists a gap in a key's numbered history,
// with the number expected and the one that came.
func TestInboxctlBreaches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, err := b.ctl("breaches")
	require.NoError(t, err)
	require.Equal(t, "no breach seen: every numbered history arrived whole\n", out)

	var last string
	for _, n := range []string{"1", "2", "5"} {
		msg := outbox.NewMessage("account-1", []byte("good: "+n))
		msg.Metadata.Set(outbox.SequenceMetadata, "0190a7c4-0000-4000-8000-00000000000a:"+n)
		require.NoError(t, b.pub.Publish(b.topic, msg))
		last = msg.UUID
	}
	for !strings.Contains(out, last) {
		require.NoError(t, b.ctx.Err(), "no breach listed:\n%s", out)
		time.Sleep(20 * time.Millisecond) // polling a condition
		out, err = b.ctl("breaches", "-consumer", "billing")
		require.NoError(t, err)
	}
	require.Regexp(t, `billing\s+gap\s+`+b.topic+`\s+account-1\s+3\s+5\s+`+last+`\s`, out)
	require.Equal(t, 2, strings.Count(out, "\n"), "a header and one breach:\n%s", out)
}

// TestInboxctlRetire: consumers lists the consumers with rows here; retire
// refuses one that wrote to the inbox within -idle, and deletes the rows of
// one that did not.
func TestInboxctlRetire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.deadLetter(t, "bad: forty-two") // billing has a row and a dead letter
	_, err := b.pool.Exec(b.ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256, processed_at)
		SELECT 'shipping', 'm-' || g, '\x00', now() - interval '100 hours' FROM generate_series(1, 3) g`)
	require.NoError(t, err)

	out, err := b.ctl("consumers")
	require.NoError(t, err)
	require.Regexp(t, `billing\s+\S+ ago\s+1\s+0\s+0\n`, out)
	require.Regexp(t, `shipping\s+(99|100)h\S* ago\s+0\s+0\s+0\n`, out)

	_, err = b.ctl("retire")
	require.ErrorContains(t, err, "retire needs -consumer")
	_, err = b.ctl("retire", "-consumer", "billing")
	require.ErrorIs(t, err, inboxadmin.ErrConsumerActive, "billing finished with a message just now")
	_, err = b.ctl("retire", "-consumer", "shipping", "-idle", "200h")
	require.ErrorIs(t, err, inboxadmin.ErrConsumerActive, "within 200h")
	out, err = b.ctl("retire", "-consumer", "shipping")
	require.NoError(t, err)
	require.Equal(t, "3 inbox rows of shipping deleted\n"+
		"shipping retired: 3 inbox rows, 0 failed attempts, 0 held keys, 0 parked messages, 0 partition clearances deleted\n", out)
	out, err = b.ctl("consumers")
	require.NoError(t, err)
	require.NotContains(t, out, "shipping")
	require.Contains(t, out, "billing")
}

func TestInboxctlUsage(t *testing.T) {
	t.Parallel()
	b := &testBundle{ctx: t.Context(), url: ""}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"show"}, "show needs one ID"},
		{[]string{"show", "x"}, "is not a number"},
		{[]string{"redrive", "-all", "7"}, "not both"},
		{[]string{"discard", "-group", "ab12", "-why", "x", "7"}, "not both"},
		{[]string{"groups", "7"}, "groups takes no arguments"},
		{[]string{"resume"}, "resume needs one ID"},
		{[]string{"list", "7"}, "list takes no arguments"},
		{[]string{"held", "7"}, "held takes no arguments"},
		{[]string{"retire", "shipping"}, "retire takes no arguments"},
		{[]string{"consumers", "-idle", "soon"}, "invalid value"},
		{[]string{"list", "-nope"}, "flag provided but not defined"},
	} {
		_, err := b.ctl(tc.args...)
		require.ErrorContains(t, err, tc.want, "inboxctl %q", tc.args)
	}
	_, err := b.ctl("list")
	require.ErrorContains(t, err, "DATABASE_URL is required")
}

// TestInboxctlSkipped: skipped lists the records the broker lost under a
// consumer, with their range, count and cause.
func TestInboxctlSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, err := b.ctl("skipped")
	require.NoError(t, err)
	require.Equal(t, "no record skipped: the broker lost nothing under the consumer's committed offsets\n", out)

	in, err := inbox.New(inbox.Config{Pool: b.pool, Consumer: "billing"})
	require.NoError(t, err)
	_, err = in.RecordSkipped(b.ctx, inbox.SkippedRange{Topic: b.topic, Partition: 0, From: 105, To: 147, Cause: inbox.Deleted})
	require.NoError(t, err)
	out, err = b.ctl("skipped", "-consumer", "billing")
	require.NoError(t, err)
	require.Regexp(t, `billing\s+`+b.topic+`\s+0\s+105\s+146\s+42\s+deleted\s+\S+\s+no\n`, out)
	require.Equal(t, 2, strings.Count(out, "\n"), "a header and one range:\n%s", out)
}
