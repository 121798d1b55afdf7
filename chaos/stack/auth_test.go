package stack

import (
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// TestAuthKfake and TestAuthApache hold every broker the stack starts to
// what the services rely on: no login, a wrong password or an unknown user
// is refused at the handshake; a principal may produce only where its ACLs
// say, and is refused by the broker elsewhere.
func TestAuthKfake(t *testing.T) {
	testAuth(t, KafkaOptions{Impl: ImplKfake})
}

func TestAuthApache(t *testing.T) {
	RequireApache(t)
	testAuth(t, KafkaOptions{Impl: ImplApache, Apache: ApacheOptions{Log: t.Logf}})
}

func testAuth(t *testing.T, opts KafkaOptions) {
	if len(KafkaBrokersFromEnv()) > 0 {
		t.Skip("KAFKA_BROKERS is set: the broker is not one the stack started")
	}
	ctx := testCtx(t, 3*time.Minute)
	opts.Partitions, opts.Topics = 1, []string{"auth.mine", "auth.theirs"}
	k, err := StartKafka(ctx, opts)
	must(t, err)
	t.Cleanup(k.Close)
	check(t, k.Authenticated(), "a broker the stack started asks for no login")

	// The harness's own login (admin) produces anywhere.
	must(t, produce(k, kafkaconf.Current(), "auth.theirs"))

	// No login, a wrong password, an unknown user: refused at the door.
	for name, creds := range map[string]kafkaconf.Credentials{
		"none":           {},
		"wrong password": {Username: AdminUser, Password: "not-" + k.Admin().Password},
		"unknown user":   {Username: "nobody", Password: "x"},
	} {
		err := produce(k, creds, "auth.mine")
		check(t, err != nil, "%s: the broker let it produce", name)
		t.Logf("%s: refused: %v", name, err)
	}

	// A principal may write auth.mine and nothing else.
	writer, err := k.AddPrincipal(ctx, "writer",
		Grant{Resource: sarama.AclResourceTopic, Name: "auth.mine", Ops: []sarama.AclOperation{sarama.AclOperationWrite, sarama.AclOperationDescribe}})
	must(t, err)
	check(t, writer.Password != "" && writer.Password != k.Admin().Password, "no password of its own")
	must(t, produce(k, writer, "auth.mine"))
	err = produce(k, writer, "auth.theirs")
	check(t, errors.Is(err, sarama.ErrTopicAuthorizationFailed), "writer produced to a topic it may not write: %v", err)

	// A principal with no grants may not even read what writer wrote.
	idle, err := k.AddPrincipal(ctx, "idle")
	must(t, err)
	err = produce(k, idle, "auth.mine")
	check(t, errors.Is(err, sarama.ErrTopicAuthorizationFailed), "a principal with no grants produced: %v", err)

	// A grant the broker refuses is an error, not a principal with fewer
	// rights than asked (Sarama's CreateACLs drops per-ACL errors).
	_, err = k.AddPrincipal(ctx, "bad-grant", Grant{Resource: sarama.AclResourceAny, Name: "x", Ops: []sarama.AclOperation{sarama.AclOperationRead}})
	check(t, err != nil, "a grant the broker refuses was taken as given")
	t.Logf("a refused grant: %v", err)

	_, err = k.AddPrincipal(ctx, AdminUser)
	check(t, err != nil, "AddPrincipal replaced the superuser")
}

// produce sends one record to topic as creds, through the CLIENT listener
// the services use.
func produce(k *Kafka, creds kafkaconf.Credentials, topic string) error {
	conf := kafkaconf.SaramaAs(creds)
	conf.Net.DialTimeout = 3 * time.Second
	conf.Metadata.Retry.Max = 1
	conf.Metadata.Retry.Backoff = 100 * time.Millisecond
	conf.Producer.Retry.Max = 0
	conf.Metadata.AllowAutoTopicCreation = false
	p, err := sarama.NewSyncProducer(k.Brokers(), conf)
	if err != nil {
		return err
	}
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("x")})
	return err
}
