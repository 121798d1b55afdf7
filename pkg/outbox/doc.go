// Package outbox publishes messages if and only if the database transaction
// that produced them commits.
//
// # Use
//
// Write the message in the transaction of the change it announces; run a
// relay that publishes what committed.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, id); err != nil {
//			return err
//		}
//		return outbox.PublishTx(ctx, tx, "orders.events", outbox.NewMessage(id, payload)) // id: the partition key
//	})
//
//	publisher, err := outboxkafka.New(outboxkafka.Config{Brokers: brokers,
//		Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)})
//	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
//	g.Go(func() error { return relay.Run(ctx) })
//
// Rows the broker refused for good are parked; package outboxadmin lists,
// retries and drops them.
//
// # The guarantee
//
// [PublishTx] writes messages as rows of outbox_messages inside the caller's
// pgx.Tx. If the transaction commits, every message is published to the
// broker at least once; if it rolls back, none is. A [Relay] ([Relay.Run])
// publishes rows in id order and waits for the broker to acknowledge them
// before it commits the transaction that claimed them and marked them
// published. So:
//
//   - a relay killed at any point (after claiming, after publishing, before
//     the mark commits) leaves its rows unmarked; they are published again by
//     the next relay. Consumers see a duplicate, never a gap: pair the outbox
//     with package inbox.
//   - a message keeps its id (the row's message_id, a UUIDv7 by default) and
//     its partition key across republishing, so the consumer can deduplicate
//     and one key's messages stay on one partition, in commit order (see
//     "The order promised").
//   - a long-running transaction does not stall the relay: uncommitted rows
//     are invisible, committed ones behind them are published, and the late
//     rows go out once their transaction commits (no high-water mark is
//     kept, so none can skip them).
//
// # A row the broker will not take
//
// PublishTx refuses, inside the caller's transaction, a message whose Kafka
// record (RecordBytes) passes the limit (DefaultMaxMessageBytes, or
// Writer.MaxMessageBytes): ErrMessageTooLarge. A row the broker refuses
// anyway (written by another program, or over a topic's lower
// max.message.bytes, or an invalid record) must not stop the outbox: a
// relay that gets a permanent refusal for a batch (IsPermanent) sends its
// rows again one at a time, publishes the good ones, and parks the refused
// one with its reason (outboxadmin.Admin.ListParked, cmd/outboxctl); a row over the relay's
// MaxMessageBytes is parked without a send. The per-key rule: the later
// rows of a parked row's topic and partition key are not sent until the row
// is retried (outboxadmin.Admin.Retry) or dropped (outboxadmin.Admin.Drop), so a key's messages never overtake
// each other; every other key goes on. Transient failures (the broker down,
// a timeout) park nothing: the batch is retried after ErrorBackoff, doubled
// for each failure in a row up to MaxErrorBackoff.
//
// # The order promised
//
// For one topic and non-empty partition key, with one relay leading (the
// default; not with [RelayConfig.Parallel]): the first time each message
// reaches Kafka, it comes after every message of that key whose
// transaction committed before its own, and before every one committed
// after. In other words, consumers see a key's messages in commit order; the
// only deviation is a repeat: a relay that fails after sending and before
// its mark commits, or a stopped relay's sends still in flight when the next
// leader took over, send a run of the key's messages again, in the same
// order, after later ones may already have gone. An inbox drops the repeats.
//
// What makes it hold:
//
//   - PublishTx takes a transaction-scoped advisory lock per (topic, key)
//     before it writes, so writers of one key take turns and each row's id
//     comes after every row of that key committed before it, whatever locks
//     the producers take (Writer.Unordered skips it, for producers that
//     serialize a key's transactions themselves); the id sequence must
//     not cache ids (CACHE 1, as Migrate makes it): with a cache, each
//     session takes ids from a range of its own, a later commit can hold a
//     lower id, and Run refuses to start (ErrIDCache; checked before the
//     first batch, once Postgres answers);
//   - the relay claims rows in id order and publishes them in that order,
//     one Publish call per run of a topic, and outboxkafka.Publisher allows one
//     request in flight per broker connection, so a retry cannot overtake;
//   - the relay's lead and its marks live in one transaction (see
//     RelayConfig.BatchTimeout): a relay that lost its session cannot
//     commit marks, Postgres ends a stopped relay's session past
//     BatchTimeout, and server-side TCP keepalives find a vanished one
//     within seconds;
//   - a row parked because the broker will never take it holds back the
//     later rows of its key (see below).
//
// Messages with an empty key have no order: Kafka spreads them over
// partitions.
//
// # Why not Watermill's Forwarder
//
// Watermill's forwarder component over watermill-sql is the ecosystem's
// outbox: the producer publishes into an SQL "topic", and a forwarder
// subscribes to it and republishes to Kafka. Its SQL subscriber hands over
// one message at a time and waits for each acknowledgement before the next,
// and it polls (1s by default). This relay instead claims and marks a batch
// of rows with one UPDATE (of the rows a SELECT … FOR UPDATE SKIP LOCKED
// locked), publishes the batch, and then commits: three round trips to
// Postgres per batch; and it LISTENs for the NOTIFY that
// PublishTx queues in the producer's transaction, so it wakes within
// milliseconds of a commit and polls only as a fallback; and outboxkafka.Publisher
// sends a batch in one produce round trip instead of one per message. The
// benchmark in bench/ runs both side by side against the same broker: the
// textbook relay there (services/internal/platform/textbook) is watermill-sql's subscriber with
// its default settings feeding watermill-kafka's publisher, the Forwarder's
// engine.
//
// # Several replicas
//
// Every replica may run a Relay. By default they take turns through a
// transaction-scoped advisory lock, so rows leave in id order; a standby
// takes over within PollInterval of the active relay's death, and the rows
// the dead relay had claimed are unlocked by its dropped connection. Set
// RelayConfig.Parallel to let replicas publish at once with SKIP LOCKED,
// giving up cross-replica ordering.
//
// # Sharded relays
//
// With RelayConfig.Shards = N > 1 the outbox is divided into N shards: a
// row's shard is a hash of its partition key (hashtext, so the same key
// always maps to the same shard; a row without a key, which has no order to
// keep, goes by its id). Replicas share the shards through leases, rows of
// outbox_shards (migration 003) with an owner, a fencing token that grows
// at every change of owner, and an expiry. Every LeaseTTL/3 a relay
// heartbeats (outbox_relays), renews its leases where the token is still
// its own, gives back what is over its fair share, ceil(N / live relays),
// and takes free or expired leases up to it. A relay that stops gives its
// shards back at once; a dead one's move after LeaseTTL. The count must be
// the same in every replica, and changes only while no relay holds a live
// lease (a relay refuses to start otherwise).
//
// Why leases rather than per-shard advisory locks: a session-level lock is
// held as long as its connection lives, so a paused process (SIGSTOP, a GC
// or VM stall) would keep its shards for as long as it is paused; a lease
// expires, and its token tells a stale owner from the current one even when
// both use the same RelayID (a restarted pod with a stable name).
//
// The fence. A batch runs in one transaction that locks the leases it relies
// on FOR SHARE, in the statement that claims the rows, and claims only rows
// of the shards whose lease still carries the relay's id and token. A
// takeover (an UPDATE of the lease, FOR UPDATE SKIP LOCKED) cannot pass an
// open batch, and a giving-back waits for it: a shard changes hands only
// between batches. A relay that lost a shard claims nothing of it again,
// and a relay paused inside a batch cannot mark: Postgres ends its session
// BatchTimeout + 1s after its last statement (see RelayConfig.BatchTimeout),
// which rolls its claim back and frees the lease for the next owner.
// Sharded batches take the schema's relay lock shared, so a sharded relay
// never publishes beside an unsharded one's batch (a replica configured
// without Shards); Parallel relays ignore all of this and keep no order.
//
// The promise, per topic and partition key: reading what the broker holds
// in offset order and keeping the first copy of each message id gives
// exactly the key's rows in commit order, none missing, across any number
// of handovers. Besides first copies the broker can hold repeats, and only
// of messages already sent: a batch that was sent and not marked (a relay
// killed after the broker acknowledged it, or one that lost its session) is
// sent again by the shard's next owner from the same first row, and a
// relay paused inside its send may, when it wakes, still deliver the copies
// it had in hand, after the next owner sent them. An inbox suppresses
// repeats, so a consumer applies each key's messages once, in commit order.
// Fencing the broker itself (a Kafka transactional id per shard) would
// keep even those late copies out; it is not done here.
//
// # One schema, one outbox
//
// The tables (outbox_messages, outbox_dropped, and schema_migrations where
// Migrate records them) live in the schema the pool's connections resolve
// first: the default search_path puts them in public. To keep them apart
// from your own tables, or to run several outboxes in one database, create a
// schema and give the pool search_path=<schema> (in the connection string,
// or pgxpool.Config's ConnConfig.RuntimeParams). The relay's lead, the
// producers' per-key locks and the NOTIFY channel ([NotifyChannel]) are
// derived from that schema's name, so two schemas' relays never take each
// other's lead or wake each other. The advisory locks are two-part keys:
// first halves 7412002 (the relay's lead), 7412003 (the producer that
// notifies) and 7412004 (a partition key's writers), second halves hashes of
// the schema (and topic and key); a program of yours whose own two-part
// advisory locks use those first halves would share them. Behind PgBouncer
// in transaction mode, set search_path as a startup parameter it tracks, or
// keep the default schema.
//
// Upgrading from a version whose relay took a one-part lock (7412002) and
// whose producers notified on the channel outbox_messages: old and new
// binaries take different locks, so while both run two relays can lead at
// once and one key's rows can leave out of order. Stop every old relay
// before the first new one starts (producers may be rolled: their old
// notifications only go unheard, and the relay's poll finds the rows).
//
// # Retention
//
// Published rows stay for RelayConfig.Retention (for inspection), and the
// relay deletes older ones in batches. The relay's query uses a partial index
// on unpublished rows, so a large published backlog does not slow it.
//
// A partitioned outbox (RelayConfig.Partitions; PartitionByTime converts
// the table in place, and producers change nothing) holds one block of
// PartitionIDs ids per interval of time. The relay's retention round makes
// the partitions ahead, moves the id sequence forward to the current
// interval's block at its first round in it, and drops a whole partition
// once the ids have left it and every row in it is published and past
// Retention: no DELETE, and a long transaction elsewhere keeps no more dead
// tuples than the partitions not yet dropped hold. Ids keep growing, so
// the id order and each key's order are those of a plain table
// (docs/partitioning.md).
package outbox
