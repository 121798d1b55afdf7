// Package inboxkafka is what the inbox knows about Kafka, through Sarama and
// watermill-kafka: where a delivered message sits in its partition
// (Position, for inbox.Config.Position), the first offset Kafka still holds
// (ReadLogStart, for inbox.Config.LogStart), and how late Kafka can hand a
// message out again (CheckRetention, against inbox.Config.Retention).
//
//	if _, err := inboxkafka.CheckRetention(admin, cfg.Retention, "orders.events"); err != nil {
//		return err // Kafka can redeliver later than the inbox keeps rows
//	}
//	cfg.Position = inboxkafka.Position // each row records where Kafka holds its message
//	cfg.LogStart = func(ctx context.Context) (inbox.LogStart, error) {
//		return inboxkafka.ReadLogStart(client, "orders.events") // rows kept while Kafka holds them
//	}
//
// It is a package of its own so that pkg/inbox stays broker-agnostic: a
// consumer of another broker never links Sarama.
package inboxkafka
