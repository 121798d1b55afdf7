package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// intruder is the principal the harness creates with no grants at all: it
// can log in, and may do nothing.
const intruder = "intruder"

// kafkaResults holds, per class written as another principal, what the
// broker answered.
type kafkaResults struct {
	mu  sync.Mutex
	out map[string]error // class → the broker's refusal, or nil: accepted
}

// login is the Kafka login of principal as: a service's own (system.Logins),
// or the intruder's, created on first use; while the harness kills and
// pauses brokers that can take a few tries, for up to two minutes.
func (h *hostile) login(ctx context.Context, as string) (kafkaconf.Credentials, error) {
	if l, ok := h.sys.Logins[as]; ok {
		return l, nil
	}
	if as != intruder {
		return kafkaconf.Credentials{}, fmt.Errorf("no principal %q", as)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l, err := h.sys.Kafka.AddPrincipal(ctx, intruder+"-"+uuid.NewString()[:8])
		if err == nil || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return kafkaconf.Credentials{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// sendAs writes m as its principal through the listener the services use,
// and records the broker's answer. A refusal for authorization ends it; a
// transient failure (a broker the harness killed, a leader moving) is
// retried for up to two minutes, so an outage is never taken for a refusal.
func (h *hostile) sendAs(ctx context.Context, m hostileMsg) error {
	login, err := h.login(ctx, m.as)
	if err != nil { // recorded as the class's result: the other classes still go out
		h.record(m.class, fmt.Errorf("no login for %s: %w", m.as, err))
		return nil
	}
	conf := kafkaconf.SaramaAs(login)
	conf.Net.DialTimeout = 3 * time.Second
	conf.Metadata.Retry.Max, conf.Producer.Retry.Max = 1, 0
	conf.Metadata.AllowAutoTopicCreation = false
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err = publishOnce(h.sys.Kafka.Brokers(), conf, m)
		if err == nil || errors.Is(err, sarama.ErrTopicAuthorizationFailed) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	h.record(m.class, err)
	return nil
}

// record keeps what the broker answered class's write.
func (h *hostile) record(class string, err error) {
	h.kafka.mu.Lock()
	defer h.kafka.mu.Unlock()
	if h.kafka.out == nil {
		h.kafka.out = map[string]error{}
	}
	h.kafka.out[class] = err
}

func publishOnce(brokers []string, conf *sarama.Config, m hostileMsg) error {
	return kafkaconf.PublishOnce(brokers, conf, m.topic, m.message())
}
