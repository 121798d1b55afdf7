// Package inboxkafka is what the inbox knows about Kafka, through Sarama and
// watermill-kafka: where a delivered message sits in its partition
// (Position, for inbox.Config.Position), the first offset Kafka still holds
// (ReadLogStart, for inbox.Config.LogStart), and how late Kafka can hand a
// message out again (CheckRetention, against inbox.Config.Retention).
//
// It is a package of its own so that pkg/inbox stays broker-agnostic: a
// consumer of another broker never links Sarama.
package inboxkafka
