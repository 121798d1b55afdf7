package platform

import (
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/signature"
)

// signing is what SIGNING_KEY and TRUSTED_KEYS turn on: the relay signs with
// the service's key, the inbox verifies what it consumes from topic against
// the trusted keys, and what it reads from its redrive topic against the
// service's own (an operator's redrive goes out through the service's own
// relay, signed with its key; the producers' topics never carry it).
type signing struct {
	sign   *signature.Key
	verify func(*message.Message) error
}

func newSigning(cfg Config, topic, redrive string) (signing, error) {
	var s signing
	var trusted []signature.Trusted
	if cfg.SigningKey != "" {
		k, err := signature.ParseKey(cfg.SigningKey)
		if err != nil {
			return s, fmt.Errorf("SIGNING_KEY: %w", err)
		}
		s.sign = &k
		if len(cfg.TrustedKeys) > 0 {
			trusted = append(trusted, signature.Trusted{Key: k, Topics: []string{redrive}})
		}
	}
	for _, raw := range cfg.TrustedKeys {
		k, err := signature.ParseKey(raw)
		if err != nil {
			return s, fmt.Errorf("TRUSTED_KEYS: %w", err)
		}
		if s.sign != nil && k.ID == s.sign.ID {
			continue // its own key, trusted already
		}
		trusted = append(trusted, signature.Trusted{Key: k, Topics: []string{topic}})
	}
	if len(trusted) > 0 {
		v, err := signature.NewVerifier(trusted...)
		if err != nil {
			return s, fmt.Errorf("TRUSTED_KEYS: %w", err)
		}
		s.verify = inboxkafka.Verify(v)
	}
	return s, nil
}

// publisher returns pub behind a signing publisher when the service signs.
func (s signing) publisher(pub message.Publisher) (message.Publisher, error) {
	if s.sign == nil {
		return pub, nil
	}
	return signature.NewPublisher(pub, *s.sign, outbox.PartitionKey)
}

// warn says what the service will not do for want of keys.
func (s signing) warn(log *slog.Logger, topic string) {
	if s.sign == nil {
		log.Warn("SIGNING_KEY is unset: the events this service publishes are not signed")
	}
	if s.verify == nil {
		log.Warn("TRUSTED_KEYS is unset: the inbox applies an event whoever wrote it to " + topic)
	}
}
