// Package inbox applies each consumed message at most once per consumer, and
// acknowledges it only after its effects are committed.
//
// # Use
//
// Wrap the handler; it writes through the transaction the inbox opened,
// in which the inbox row of (consumer, message id) is written too. Run the
// inbox beside the router.
//
//	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "inventory"})
//	if err != nil {
//		return err
//	}
//	router.AddConsumerHandler("reserve", "orders.events", subscriber, func(msg *message.Message) error {
//		_, err := inbox.Tx(msg.Context()).Exec(msg.Context(),
//			`UPDATE stock SET reserved = reserved + 1 WHERE sku = $1`, skuOf(msg))
//		return err // nil: committed, then acked; an error: rolled back, retried, dead-lettered
//	}).AddMiddleware(in.Middleware)
//	g.Go(func() error { return in.Run(ctx) }) // batches and the retention sweep
//
// Without Watermill's router, hand each record to [Inbox.Deliver] and
// commit its offset once it returns nil:
//
//	if err := in.Deliver(ctx, record.Topic, msg, reserve); err != nil {
//		return err // not settled: leave the offset, the record comes again
//	}
//	client.CommitRecords(ctx, record)
//
// What an operator does to what the inbox quarantined (list, retry, drop,
// in bulk) is package inboxadmin's. examples/killed-after-commit runs all of
// it in one program, killed between the commit and the offset.
//
// # The guarantee
//
// [Inbox.Middleware] wraps a Watermill handler. For every delivery it opens one
// pgx transaction, inserts (consumer, message_id, payload_sha256) into
// inbox_messages with ON CONFLICT DO NOTHING, runs the handler with that
// transaction in the message context ([TxFromContext]), and commits. The
// handler's domain writes, its outbox writes and the inbox row commit or roll
// back together. The middleware returns only after the commit, so the router
// acknowledges, and watermill-kafka marks the Kafka offset, only after it.
//
// Together with an at-least-once broker this gives effectively-once
// processing under any crash:
//
//   - killed before the commit: nothing was written; the broker redelivers
//     and the message is applied then.
//   - killed after the commit, before the offset was committed: the broker
//     redelivers; the inbox row is there, so the handler is skipped
//     (a duplicate) and the message is acknowledged.
//   - the same message delivered twice at once (a rebalance, a republishing
//     relay): the second INSERT waits for the first transaction and then sees
//     its row.
//
// A redelivery whose payload differs from the one applied under the same id
// is not silently dropped as a duplicate: it is quarantined with both
// hashes. So is one that races: when a delivery fails for good while one of
// another payload waits on its row, whichever settles second is the
// conflict. A handler that keeps failing is retried with backoff, its attempts
// counted in the database; after MaxAttempts (or at once, for errors wrapped
// with [Permanent]) the message is dead-lettered: recorded with its reason in
// inbox_quarantine and published to the dead-letter topic through the
// outbox, in one transaction; then it is acknowledged, so one poison message
// never blocks its partition, whatever it holds: a record with no value is
// kept with a NULL payload, headers that are not text exactly in
// raw_metadata ([Quarantined].PayloadNull, RawMetadata), so no value a
// producer can write fails the insert that settles it. A counter the inbox
// keeps (a row's duplicates) stops at its maximum rather than overflow.
// With [Config.Verify] a message is authenticated before its id is looked
// up (package signature): a forgery under a fresh id is quarantined, never
// applied. With [Config.Envelope] a record whose partition key, topic, type
// header or id says otherwise than its payload is quarantined too, naming
// the disagreement: a producer with a bug signs its bug. The operator's
// side (package inboxadmin) lists what was quarantined, writes a dead
// letter back to its topic once the handler is fixed (Admin.Retry), and
// closes one for good (Admin.Drop).
//
// # Batches
//
// [Inbox.Handler] is the same guarantee for a handler that takes many messages
// at once (a [BatchFunc]). The router runs one delivery per partition at a
// time, so a consumer with many partitions has many in flight; with
// [Config.BatchSize] > 1, those that arrive together are inserted into
// inbox_messages by one statement, the ones not seen before are handed to one
// call of the BatchFunc, and all of it commits in one transaction. Every
// delivery of the batch returns only after that commit. Batches form only
// while [Inbox.Run] runs (beside the router: it runs the batch transactions
// and the retention sweep); a delivery that arrives while it does not is
// applied alone, correctly but unbatched. The BatchFunc writes
// set-based (one UPDATE … FROM unnest for the batch), so a batch costs a few
// statements and one WAL flush however many messages it holds. If the
// BatchFunc fails, nothing of the batch commits and each half is tried again
// as a batch of its own, down to single messages, so the rest still commit
// in batches and a poison message fails, is retried and is dead-lettered by
// itself. A batch that fails for another reason (the database, the commit)
// sends each message to be applied alone. Config.BatchLinger lets a busy
// consumer's batch wait briefly for the deliveries its predecessor released,
// so batches hold about every partition instead of half of them. Middleware
// batches too, with a savepoint per message: fewer commits, the same number
// of statements.
//
// # What it needs from you
//
//   - The handler writes only through the transaction it is given, and does
//     not commit it.
//   - Consumer names the deduplication scope: one name per logical consumer,
//     shared by its replicas.
//   - Run ([Inbox.Run]) beside the router, for its batch transactions and
//     its retention sweep.
//   - The tables live in the schema the pool's search_path resolves first
//     (see pkg/outbox, "One schema, one outbox"); Migrate creates the
//     inbox's there, and the outbox table its dead letters go through.
//   - Retention must cover the RedeliveryHorizon: a message redelivered after
//     its inbox row was swept is applied again. Validate refuses a shorter
//     Retention. How late Kafka can redeliver is Kafka's to say, not yours:
//     a group whose offsets expired (offsets.retention.minutes after it last
//     had members) replays from the oldest record still kept, up to the
//     topic's retention.ms + segment.ms after it was written. Call
//     inboxkafka.CheckRetention at start-up: it reads those configs through the admin
//     API and refuses a Retention they outlast, naming both numbers. The
//     default Retention, 15 days, covers Kafka's defaults (7 + 7 days).
//     Better still, set Config.Position and Config.LogStart
//     (inboxkafka.Position, inboxkafka.ReadLogStart): each row records
//     the partition and the highest offset of the copies of its message
//     this consumer saw, and the sweep keeps a row past Retention for as
//     long as its partition's log-start offset has not passed it. Kafka can
//     hand out only what it still holds, so a replay, whatever the group's
//     offsets and whatever the topic's retention became since start-up,
//     never meets a swept row. What it cannot see: a copy a producer writes
//     later than Retention after the first (RedeliveryHorizon bounds that),
//     and copies on another partition (the row is then swept by age alone).
//
// # A partitioned inbox
//
// An inbox that keeps weeks of rows can be partitioned by the time in each
// message's id (Config.Partitions; PartitionByIDTime converts the table in
// place, the table as it was becoming the first partition). Every copy of
// a message carries the same id and so goes to the same partition, where
// it meets the first copy's row; an id that carries no time (UUIDv7Time
// reads pkg/outbox's ids) is quarantined. The sweep then drops a whole
// partition once every consumer with rows in it would have swept them all,
// by the same conditions as above, instead of deleting rows: no dead tuples
// for vacuum, which a long transaction elsewhere would hold back. Every
// consumer of the table must run with Config.Partitions before the
// conversion's cut-over passes. docs/partitioning.md has the design and
// what was checked on Postgres.
//
// # Holding a poisoned key
//
// By default a dead letter skips its key: the partition goes on, so the
// key's later messages are applied before the dead letter, once redriven,
// is. For handlers where one key's messages must apply in order (an order's
// "paid" before its "shipped"), Config.OnDeadLetter = HoldKey holds the key
// instead. The promise, per consumer and per (topic, partition key):
//
//   - once a message of the key is dead-lettered, the key's later messages
//     are parked, not applied: each is recorded in the transaction that
//     would have applied it (its inbox row with status 'parked', so a
//     redelivery is a duplicate and another payload a conflict; its payload
//     and metadata in inbox_parked), and acknowledged. Other keys flow.
//   - a redrive of the dead letter (inboxadmin's Admin.Retry) writes it
//     back through the outbox as before; when it comes back it alone goes
//     through, and the commit that
//     applies it releases the key. The delivery that released it then
//     applies the parked messages, in arrival order, one transaction each,
//     through the same handler and the same retry loop, before it is
//     acknowledged; then the hold is gone. Each is applied exactly once: its
//     inbox row turns from 'parked' to 'processed' in its own transaction.
//   - dropping the dead letter (Admin.Drop) releases the key too: the
//     first parked message is written back through the outbox in its place (it carries
//     [ReleaseOfMetadata]), and the others follow it as after a redrive.
//     Release goes through Kafka because only the consumer has the handler.
//   - a message that fails again, the redriven one or a released one, is
//     dead-lettered and holds the key again; what was parked behind it stays
//     parked. So does the next poison of a key once released.
//   - a crash in the middle of a release loses nothing: the releasing
//     delivery was not acknowledged, so it comes back (a duplicate) and,
//     finding the key released, goes on where the release stopped.
//
// A message whose key is empty is never held. inboxadmin's Admin.ListHeld
// and Admin.HoldStats show what is held (inboxctl held). The key comes from
// Config.Key: the outbox's partition_key metadata by default, or
// inboxkafka.Key, the Kafka record's.
// A redriven or written-back message lands on its key's partition only when
// its metadata holds that key (outbox.KeyMetadata, as the outbox's relay
// leaves it), and only a UUID id can go back through the outbox: a drop
// whose first parked message has another id releases the key at once, and
// the key's next delivery applies the parked messages before itself.
// With Config.RedriveTopic, a redriven message comes back on the
// consumer's own topic, not its producer's, and releases its key as a
// message of the topic it came from (RedriveTopicMetadata).
//
// Why this is race-free, and what it costs. Every transaction that reads or
// changes a hold locks its row (inbox_held_keys, FOR UPDATE), then looks at
// the parked messages in a statement of its own, so it sees what the
// transaction it waited for committed: a parking and a release step take
// turns, and a release never deletes a hold with a message parked behind
// it. A key that is not held has no row: its deliveries pay one index
// lookup and lock nothing. That no row can appear while a later message of
// the key is being applied is Kafka's promise, not a lock's: a key's
// messages come on one partition, in order, and the next is handed out only
// after the dead letter's delivery was acknowledged, after its commit
// (which holds the key); a replica that takes the partition over starts at
// the committed offset, at or before the dead letter. Batches
// (Config.BatchSize > 1) read the holds of their deliveries' keys and leave
// the held ones to go alone; a batch never holds two messages of one key,
// since it holds one delivery per partition. Messages of one key on several
// partitions have no order to keep. Turning HoldKey off leaves what is
// parked parked: redrive or discard every held key first. With HoldKey off,
// nothing of this runs.
//
// # Offset commits
//
// watermill-kafka marks an offset when a message is acknowledged, and Sarama
// commits marked offsets every Consumer.Offsets.AutoCommit.Interval (1s by
// default). A crash redelivers what was marked but not yet committed: a
// shorter interval means fewer redeliveries after a crash and more commit
// requests. With the inbox those redeliveries are harmless duplicates, so the
// interval is a cost trade-off, not a correctness one.
package inbox
