// Package kafkaconf holds the one Sarama configuration that the services,
// the tests and the tools share, so they speak the same protocol version to
// the embedded kfake broker and to real Kafka.
package kafkaconf

import (
	"github.com/IBM/sarama"
	"github.com/rcrowley/go-metrics"
)

// Sarama keeps a histogram per request and per broker in go-metrics, which
// nothing here reads; switching it off is Sarama's documented way and saves
// a few percent of a busy service's CPU. It is process-wide, so it is set
// once, before any client exists.
func init() { metrics.UseNilMetrics = true }

// Version is the Kafka protocol version every Sarama client here uses. It is
// set explicitly: Sarama's implicit default is older than Kafka 4 accepts
// (Kafka 4 refuses clients below protocol 2.1), and it is one that kfake
// serves too (chaos/stack's tests check that).
var Version = sarama.V2_8_0_0

// Sarama returns a fresh config; callers may adjust their copy.
//
//   - producer: waits for all in-sync replicas and returns successes, so the
//     outbox relay marks a row only after the broker acknowledged it;
//   - consumer: a new group starts at the oldest offset, so nothing published
//     before a consumer first joined is skipped;
//   - login: Current() (UseCredentials, else KAFKA_SASL_*), if any.
func Sarama() *sarama.Config { return SaramaAs(Current()) }

// SaramaAs is Sarama logging in as creds (none when empty), whatever
// Current() is: a harness acting as a principal other than its own.
func SaramaAs(creds Credentials) *sarama.Config {
	c := sarama.NewConfig()
	c.Version = Version
	c.ClientID = "outbox-inbox"

	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Idempotent = false

	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Return.Errors = true

	c.Metadata.AllowAutoTopicCreation = true
	creds.Apply(c)
	return c
}
