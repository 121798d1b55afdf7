// Package effect is the third row of the pattern, beside pkg/outbox and
// pkg/inbox: effects outside the database (a payment capture, a call to a
// partner's API, an e-mail) made with idempotency keys.
//
// Record the intent in the domain's transaction; a runner calls with its
// key as the idempotency key and records the outcome:
//
//	_, err := effect.EnqueueTx(ctx, tx, "capture", "capture-"+orderID, payload)
//
//	runner, err := effect.NewRunner(effect.Config[captured]{Pool: pool, Kind: "capture",
//		Do: func(ctx context.Context, e effect.Effect) (captured, error) {
//			return provider.Capture(ctx, e.Key, e.Payload) // e.Key: the idempotency key
//		},
//		Record: func(ctx context.Context, tx pgx.Tx, e effect.Effect, c captured, err error) error {
//			_, err = tx.Exec(ctx, `UPDATE orders SET capture = $2 WHERE id = $1`, orderOf(e), c.ID)
//			return err
//		},
//	})
//	g.Go(func() error { return runner.Run(ctx) })
//
// The three rows, and what each guarantees:
//
//   - The outbox: a message leaves if and only if the transaction that wrote
//     it committed, at least once (outbox.PublishTx in the domain's
//     transaction, a relay that publishes and then marks).
//   - The inbox: a message's database writes are applied once, however often
//     it is delivered (the inbox row and the handler's writes share a
//     transaction; the offset is committed after it).
//   - Effect keys: a call to another system is performed once, however often
//     it is made, when that system honours an idempotency key: the intent is
//     recorded with EnqueueTx (or EnqueueBatchTx, several in one statement)
//     in the domain's transaction, under a key derived from what asked for
//     it (never a random one); a Runner calls with that key, retries with
//     backoff, and records the outcome in the transaction that ends the
//     effect (Record; calls that returned together share one).
//
// The crash windows, named in pkg/failpoint and armed like the others:
//
//   - before-effect: the intent is committed, the call not made. The effect
//     stays pending; after the lease another runner (or the restarted one)
//     makes the call. Nothing was performed, so nothing repeats.
//   - after-effect-before-record: the outside system performed the effect,
//     and the runner died before its record committed. The effect is called
//     again with the same key, and the outside system answers with the
//     stored outcome instead of performing it again (Stripe's Idempotency-Key:
//     the same key and body return the first response, with
//     Idempotent-Replayed: true). Without the key this window performs the
//     effect twice; the chaos harness's control run switches the key off and
//     counts the double captures it causes.
//
// A call whose response is lost (the provider performed it, the connection
// died) is this second window seen from the network, and closes the same
// way. So does a runner that outlived its lease beside the one that claimed
// the effect next: both calls carry the key, the outside system performs
// one (answering the other 409, in flight, or with the stored response),
// and the first record to commit ends the effect; the other finds it ended
// and records nothing. The late runner cannot shorten the new lease either:
// a retry it schedules is fenced by the attempt it claimed.
//
// The key holds only while the outside system remembers it (Stripe: 24
// hours). An effect still pending after Config.MaxAge, set below that, is
// not called again but ended failed (ErrTooOld) for a person to settle. A
// Record that fails leaves the effect pending with its reason in last_error
// and retries it after the backoff, like a failed call.
//
// A permanent refusal is an outcome, not a retry loop: Do returns a
// decline as its result (Record writes it where a person can see it, a
// declined order), or an error wrapped with Permanent (the request can never
// succeed: the effect ends as failed, and Record records why).
//
// When the outside system has no idempotency keys (most e-mail and SMS
// gateways), nothing on this side can make the effect happen once: the
// after-effect-before-record window remains, and the effect is at least
// once. Record the intent first and send after its commit (this package's
// order), never the other way round: then a crash costs at most a repeated
// message inside that one narrow window, where sending first and recording
// after can send and forget it, or send it without the domain change that
// asked for it. Keep the window narrow (record right after the call), and
// give the message an id of its own the recipient can spot repeats by.
//
// Why a table of its own and not River's InsertTx: River is a well-kept job
// queue and its JobCompleteTx gives the same record-with-the-outcome
// transaction. It also brings its own schema, migrations and leader
// election to run beside ours, and a job model (retries, priorities,
// uniqueness options) larger than one call with a key. This package is the
// part of that a caller needs to see the pattern whole: one table, one
// claim statement, two crash windows, in the same style as the outbox and
// the inbox. A service with many kinds of jobs may well prefer River; the
// windows and the key are the same there.
package effect
