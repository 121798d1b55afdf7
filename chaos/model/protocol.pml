/*
 * protocol.pml: the transactional outbox, the broker, the consumer inbox,
 * the domain guard and the effect runner, as one Promela model for Spin.
 * docs/model.md says what is modelled, what is abstracted, the bounds and
 * how to run it (make model, which runs chaos/model/check.sh).
 *
 * One file, checked in three rows (-DROW=1, 2, 3): the whole protocol in
 * one state space is beyond minutes (a first try passed 22 million states
 * unfinished), so each row runs with its neighbour replaced by what the
 * neighbour's own run proves of it:
 *
 *   ROW 1, the outbox: the producer (orders' payment transaction), two
 *     sharded relays with leases, the environment (a paused relay whose
 *     session the fence ends, a lease expiring under a live owner) and the
 *     partition, of which it keeps what its properties read: which rows
 *     have a copy, in which order the first copies came.
 *   ROW 2, the inbox: a broker that appends every committed row at least
 *     once, first copies of a key in commit order (what row 1 proves), with
 *     copies again (a relay's republished batch); the hostile producer (a
 *     payload conflict, a poison message, a second decision for an order);
 *     the consumer: the inbox middleware, the handler with its domain
 *     guard, the offset committed after the commit, redelivery from the
 *     committed offset after a crash.
 *   ROW 3, the effect: the consumer's decisions recording each capture's
 *     intent once per key (the effects table's UNIQUE (kind, key)), two
 *     effect runners with leases, the provider honouring idempotency keys,
 *     and a runner that outlives its lease.
 *
 * Every crash window of pkg/failpoint is a point where a process can die,
 * written CRASH(name, ...) with the window's name, '-' written '_' (a
 * Promela name cannot hold '-'). chaos/model/model_test.go holds the list of
 * windows below equal to pkg/failpoint.All, and each name used by a CRASH.
 *
 * Controls, each a -D switch that must make a property fail (check.sh):
 *   INBOX_OFF           the inbox's dedupe off (inbox.Config.DisableDedupe)   row 2
 *   COMMIT_BEFORE_TX    the offset committed at delivery, before the inbox tx row 2
 *   PARALLEL_RELAYS     relays claim side by side, no shards (RelayConfig.Parallel) row 1
 *   NO_EFFECT_KEY       the capture sent without its idempotency key          row 3
 *   UNFENCED_LEASE      a relay claims by its own memory of its leases: the
 *                       claim neither checks the lease's owner and token nor
 *                       locks it FOR SHARE                                    row 1
 *   GUARD_OFF           the domain guard off                                  row 2
 *   MARK_BEFORE_PUBLISH the relay commits its mark, then publishes           row 1
 *   NO_EFFECT_LEASE     a claimed effect never becomes due again             row 3
 *
 * A lossy database failover (-DFAILOVER, rows 1 and 2): a standby holds a
 * prefix of each database's commits, caught up at any moment (asynchronous
 * replication) or at each commit (-DSYNC_REPL: synchronous); a failover
 * promotes it, and the commits it did not hold are gone: a suffix of
 * committed transactions lost. Every session dies with the old primary,
 * the leases are past their time, and the timeline (epoch) moves on.
 * -DSTANDBY_GATE is pkg/standby: what leaves a transaction (a batch
 * published, a payment answered, an offset committed) waits until the
 * standby holds every commit made before the wait, or fails when the
 * timeline moved. Its properties: no ghost event (a copy on the partition
 * whose row the producer's database no longer holds), no answered payment
 * lost, no lost message (an offset committed past a message whose inbox row
 * is gone). Asynchronous replication without the gate must fail them
 * (check.sh: failover-async-ghost, failover-async-lost).
 */

#ifndef ROW
#define ROW 1
#endif

/* ---- the crash windows: pkg/failpoint's names, '-' written '_' ---- */
mtype = { /* the model's only mtype, so printf's %e names a window */
	after_commit_before_response,
	after_claim_before_publish, after_publish_before_mark,
	before_begin, after_inbox_insert, after_handler_before_commit, after_commit_before_ack,
	before_effect, after_effect_before_record
};

/* ---- bounds (docs/model.md; check.sh prints them) ---- */
#ifndef MAXCRASH
#define MAXCRASH   2   /* process kills, in any of the row's windows */
#endif
#ifndef MAXPAUSE
#define MAXPAUSE   1   /* row 1: relay sessions ended by the fence while the relay is paused */
#endif
#ifndef MAXEXPIRE
#define MAXEXPIRE  1   /* row 1: shard leases expiring under a live owner */
#endif
#ifndef MAXRELEASE
#define MAXRELEASE 1   /* row 1: shards given back (rebalancing) */
#endif
#ifndef MAXDUP
#define MAXDUP     1   /* row 2: copies appended again by the broker */
#endif
#ifndef MAXEFFLOSS
#define MAXEFFLOSS 1   /* row 3: effect leases expiring under a runner still calling */
#endif
#ifndef MAXPUBFAIL
#define MAXPUBFAIL 1   /* row 1: batches whose publish fails before a row is sent (the broker is down): the claim rolls back */
#endif
#ifndef MAXDBFAIL
#define MAXDBFAIL  1   /* row 2: consumer transactions that fail, at their start or their commit (the database went away) */
#endif
#ifndef MAXPFAIL
#define MAXPFAIL   1   /* row 3: provider calls that fail: nothing done, or done and the answer lost */
#endif
#ifndef MAXFAILOVER
#define MAXFAILOVER 1  /* -DFAILOVER: lossy failovers of the row's database */
#endif
#ifdef NO_EFFECT_LEASE
/* the control has no lease to expire */
#undef MAXEFFLOSS
#define MAXEFFLOSS 0
#endif
#define BATCH      2   /* rows per relay batch */
#define NRELAY     2   /* relay replicas (the lease steps are written out for 2 shards) */
#define NSHARD     2
#define NORD       2   /* orders 0 and 1; an order's id is its partition key */
/* the producer's rows, one transaction each, in this commit order:
 * 0 OrderPaid(order 0), 1 OrderPaid(order 1), 2 a later event of order 0 */
#define NROWS      3   /* rows the producer commits */
#define NRUNNER    2   /* effect runners (orders replicas) */
#define MAXATT     2   /* inbox MaxAttempts */
#define LOGMAX     12  /* row 2: the partition's capacity (asserted) */

/* message ids: the producer's rows are 0..NROWS-1, then the hostile ones */
#define POISON  (NROWS)     /* its handler always fails: dead-lettered */
#define SECOND  (NROWS+1)   /* a second decision for order 0 under a new id (a producer bug) */
#define NIDS    (NROWS+2)
#define GOOD 0
#define BAD  1              /* another payload under id 0: a conflict */

#define KEY(id)     (((id) == 1 || (id) == POISON) -> 1 : 0)
#define SHARD(id)   (KEY(id) % NSHARD)
#define DECIDES(id) ((id) == 0 || (id) == 1 || (id) == SECOND)

/* effect states */
#define NONE    0
#define PENDING 1
#define DONE    2

/* ---- the producer's database: outbox and shard leases (row 1) ---- */
bool paid[NORD];
byte ob_n;                 /* rows committed: 0 .. ob_n-1 */
bool ob_pub[NROWS];        /* published_at, committed */
byte ob_lock[NROWS];       /* r+1: relay r's open batch holds the row */
byte lease_owner[NSHARD];  /* r+1, or 0 */
byte lease_tok[NSHARD];    /* the fencing token */
bool lease_exp[NSHARD];    /* expires_at passed */
byte lease_share[NSHARD];  /* r+1: relay r's open batch holds the lease FOR SHARE */
bool tx_alive[NRELAY];     /* relay r's batch transaction is open */

/* ---- the broker: one partition (both keys), append-only (row 2) ---- */
byte log_id[LOGMAX];
bit  log_pay[LOGMAX];
byte log_n;
byte committed_off;        /* the consumer group's committed offset */

/* ---- the consumer's database (row 2) ---- */
byte inbox[NIDS];          /* 0: no row; else the payload recorded + 1 */
bool dead[NIDS];           /* dead-lettered */
byte attempts[NIDS];       /* inbox_attempts, committed on their own */
byte decided[NORD];        /* the deciding message's id + 1 (decisions) */
byte effect[NORD];         /* the capture's effects row: NONE, PENDING, DONE (rows 2, 3) */
bool eff_due[NORD];        /* claimable: new, or its lease expired */

/* ---- the provider (row 3) ---- */
bool pkey[NORD];           /* the idempotency key capture-<order> is stored */
byte captures[NORD];

/* ---- ghosts: what the properties read ---- */
bool inlog[NIDS];          /* a copy of the id is on the partition */
bit  firstpay[NIDS];       /* the payload of the id's first copy */
byte applied[NIDS];        /* the consumer's transactions that committed the id's handler */
bool got[NROWS];           /* a producer's row applied with its committed payload */
bool twice;                /* a handler committed twice for one id */
bool conflict_applied;     /* a handler committed a payload other than the id's first */
bool order_bad;            /* a row's first copy published before an earlier row of its key */
bool decided_twice;        /* an order decided twice */
bool captured_twice;       /* the provider captured an order twice */
byte crashes, pauses, expiries, releases, dups, effloss, pubfails, dbfails, pfails;

/* ---- the standby and its failovers (-DFAILOVER) ---- */
byte epoch;                /* the timeline: failovers so far */
byte failovers;
bool answered[NORD];       /* row 1: the client was told its payment succeeded */
bool ghost;                /* row 1: a copy on the partition whose row the producer's database no longer holds */
bool answer_lost;          /* row 1: an answered payment gone */
bool lost;                 /* row 2: an offset committed past a message whose inbox row is gone */
/* row 1: what the standby holds of the producer's database */
byte rep_n;
bool rep_pub[NROWS];
bool rep_paid[NORD];
byte rep_owner[NSHARD];
byte rep_tok[NSHARD];
/* row 2: what the standby holds of the consumer's database; commits made
 * and held, counted */
byte rep_inbox[NIDS];
bool rep_dead[NIDS];
byte rep_attempts[NIDS];
byte rep_decided[NORD];
byte rep_effect[NORD];
byte rep_applied[NIDS];
bool rep_got[NROWS];
byte c2, rep_c2;
bool dirty1;               /* row 1: a commit the standby does not hold yet */
byte j;                    /* scratch, always 0 between steps */

/* ---- the safety properties: an assertion where a ghost turns true.
 * All are checked unless -DCHECK=P_<name> keeps one (a control's run). ---- */
#define P_once     1
#define P_conflict 2
#define P_order    3
#define P_guard    4
#define P_capture  5
#define P_ghost    6
#define P_answer   7
#define P_lost     8
#if !defined(CHECK) || CHECK == P_once
#define CHECK_once     assert(!twice)
#else
#define CHECK_once     skip
#endif
#if !defined(CHECK) || CHECK == P_conflict
#define CHECK_conflict assert(!conflict_applied)
#else
#define CHECK_conflict skip
#endif
#if !defined(CHECK) || CHECK == P_order
#define CHECK_order    assert(!order_bad)
#else
#define CHECK_order    skip
#endif
#if !defined(CHECK) || CHECK == P_guard
#define CHECK_guard    assert(!decided_twice)
#else
#define CHECK_guard    skip
#endif
#if !defined(CHECK) || CHECK == P_capture
#define CHECK_capture  assert(!captured_twice)
#else
#define CHECK_capture  skip
#endif
#if !defined(CHECK) || CHECK == P_ghost
#define CHECK_ghost    assert(!ghost)
#else
#define CHECK_ghost    skip
#endif
#if !defined(CHECK) || CHECK == P_answer
#define CHECK_answer   assert(!answer_lost)
#else
#define CHECK_answer   skip
#endif
#if !defined(CHECK) || CHECK == P_lost
#define CHECK_lost     assert(!lost)
#else
#define CHECK_lost     skip
#endif

/* ---- the standby: caught up (a copy of the database's state) ---- */
inline replicate1() {
	rep_n = ob_n;
	j = 0;
	do
	:: j < NROWS -> rep_pub[j] = ob_pub[j]; j++
	:: else -> break
	od;
	rep_paid[0] = paid[0]; rep_paid[1] = paid[1];
	rep_owner[0] = lease_owner[0]; rep_owner[1] = lease_owner[1];
	rep_tok[0] = lease_tok[0]; rep_tok[1] = lease_tok[1];
	dirty1 = 0;
	j = 0
}
inline replicate2() {
	j = 0;
	do
	:: j < NIDS -> rep_inbox[j] = inbox[j]; rep_dead[j] = dead[j]; rep_attempts[j] = attempts[j]; rep_applied[j] = applied[j]; j++
	:: else -> break
	od;
	j = 0;
	do
	:: j < NROWS -> rep_got[j] = got[j]; j++
	:: else -> break
	od;
	rep_decided[0] = decided[0]; rep_decided[1] = decided[1];
	rep_effect[0] = effect[0]; rep_effect[1] = effect[1];
	rep_c2 = c2;
	j = 0
}
/* a commit of the row's database: with synchronous replication it returns
 * once the standby holds it */
#if defined(FAILOVER) && defined(SYNC_REPL)
#define COMMIT1 replicate1()
#define COMMIT2 c2++; replicate2()
#elif defined(FAILOVER)
#define COMMIT1 dirty1 = 1
#define COMMIT2 c2++
#else
#define COMMIT1 skip
#define COMMIT2 skip
#endif

/* ---- pkg/standby: wait until the standby holds every commit made before
 * the wait (target: the commits so far), unless the timeline moved (the
 * wait fails: ep is the timeline the transaction was marked on) ---- */
#if defined(FAILOVER) && defined(STANDBY_GATE)
#define GATE 1
#define MARK(t, v, e) t = v; e = epoch /* the commit's timeline, and the commits the wait is for */
#else
#define GATE 0
#define MARK(t, v, e) skip
#endif

/* ---- a crash window: the process may die here (within the budget) ---- */
#define CRASH(w, die, where) \
	if \
	:: atomic { crashes < MAXCRASH -> crashes++; printf("MSC: crash in window %e\n", w); die }; goto where \
	:: true \
	fi

/* a copy of id on the partition. Row 1 keeps only the ghosts (which ids
 * have a copy, the order check); row 2 keeps the log the consumer reads. */
inline append(id, pay) {
#if defined(FAILOVER) && ROW == 1
	if :: (id) < NROWS && (id) >= ob_n -> ghost = 1; printf("MSC: row %d reaches the partition, but the producer's database no longer holds it: a ghost\n", id); CHECK_ghost :: else fi;
#endif
#if ROW == 2
	assert(log_n < LOGMAX);
	log_id[log_n] = id; log_pay[log_n] = pay; log_n++;
#endif
	if
	:: !inlog[id] ->
		inlog[id] = 1; firstpay[id] = pay;
		if
		:: (id) < NROWS ->
			j = 0;
			do
			:: j < (id) -> if :: KEY(j) == KEY(id) && !inlog[j] -> order_bad = 1; CHECK_order :: else fi; j++
			:: else -> break
			od;
			j = 0
		:: else
		fi
	:: else
	fi
}

/* ================= row 1: the producer ================= */
proctype Producer() {
	byte o = 0, tgt = 0, ep = 0;
	do
	:: o < NORD ->
pay:		/* POST /orders/{o}/pay: one transaction, the status and the outbox row */
#ifndef FAILOVER
		atomic { if :: !paid[o] -> paid[o] = 1; assert(ob_n == o); ob_n++; printf("MSC: producer commits order %d paid and row %d\n", o, o) :: else -> printf("MSC: order %d already paid: nothing written\n", o) fi }
#else
		atomic {
			if
			:: !paid[o] && ob_n == o -> paid[o] = 1; ob_n++; COMMIT1; printf("MSC: producer commits order %d paid and row %d\n", o, o)
			:: paid[o] -> printf("MSC: order %d already paid: nothing written\n", o)
			:: !paid[o] && ob_n != o -> printf("MSC: a failover took back rows before order %d's: the client's history is gone\n", o); goto done
			fi;
			MARK(tgt, ob_n, ep)
		}
#endif
		CRASH(after_commit_before_response, skip, pay); /* the client pays again */
#if GATE
		if
		:: atomic { epoch == ep && rep_n >= tgt -> printf("MSC: the standby holds order %d's payment: answered\n", o) }
		:: atomic { epoch != ep -> printf("MSC: the primary changed before the standby held order %d's payment: 503, the client pays again\n", o) }; goto pay
		fi;
#endif
#ifdef FAILOVER
		answered[o] = 1;
#endif
		o++
	:: else -> break
	od;
#ifndef FAILOVER
	atomic { assert(ob_n == NORD); ob_n++; printf("MSC: producer commits row 2 (order 0 again)\n") }
	o = 0
#else
	atomic { ob_n == NORD -> ob_n++; COMMIT1; printf("MSC: producer commits row 2 (order 0 again)\n") }
done:
	o = 0; tgt = 0; ep = 0
#endif
}

/* ================= row 1: the relays ================= */
/* relay r's batch ends without its commit: rows and leases unlocked */
inline abort_tx(r) {
	j = 0;
	do
	:: j < NROWS -> if :: ob_lock[j] == r+1 -> ob_lock[j] = 0 :: else fi; j++
	:: else -> break
	od;
	j = 0;
	if :: lease_share[0] == r+1 -> lease_share[0] = 0 :: else fi;
	if :: lease_share[1] == r+1 -> lease_share[1] = 0 :: else fi;
	tx_alive[r] = 0
}

/* a relay killed: its session and batch gone; its leases expire (nothing
 * of the dead process can act meanwhile, so the wait is not modelled) */
#define relay_die() \
	abort_tx(r); \
	if :: lease_owner[0] == r+1 -> lease_exp[0] = 1 :: else fi; \
	if :: lease_owner[1] == r+1 -> lease_exp[1] = 1 :: else fi

#if defined(PARALLEL_RELAYS)
#define OWNS(s) 1
#elif defined(UNFENCED_LEASE)
#define OWNS(s) (snap[s] != 0)
#else
#define OWNS(s) (snap[s] != 0 && lease_owner[s] == r+1 && lease_tok[s] == snap[s])
#endif
#define CAN(i) ((i) < ob_n && !ob_pub[i] && ob_lock[i] == 0 && OWNS(SHARD(i)))

#ifdef UNFENCED_LEASE
#define TAKEABLE(s) (snap[s] == 0 && (lease_owner[s] == 0 || lease_exp[s]))
#else
#define TAKEABLE(s) (snap[s] == 0 && (lease_owner[s] == 0 || lease_exp[s]) && lease_share[s] == 0)
#endif
#define STALE(s) (snap[s] != 0 && (lease_owner[s] != r+1 || lease_tok[s] != snap[s] || lease_exp[s]))

inline take(s) {
	lease_owner[s] = r+1; lease_tok[s]++; lease_exp[s] = 0; snap[s] = lease_tok[s]; COMMIT1;
	printf("MSC: relay %d takes shard %d, token %d\n", r, s, lease_tok[s])
}
inline renew(s) {
	if
	:: lease_owner[s] == r+1 && lease_tok[s] == snap[s] -> lease_exp[s] = 0; printf("MSC: relay %d renews shard %d\n", r, s)
	:: else -> snap[s] = 0; printf("MSC: relay %d finds shard %d taken\n", r, s)
	fi
}

/* the commit: marks kept, locks released */
inline commit_marks() {
	if
	:: tx_alive[r] ->
		do
		:: i < nb -> ob_pub[bat[i]] = 1; ob_lock[bat[i]] = 0; i++
		:: else -> break
		od;
		i = 0;
		abort_tx(r);
		COMMIT1;
		printf("MSC: relay %d commits its marks\n", r)
	:: else -> printf("MSC: relay %d cannot commit: the fence ended its session\n", r)
	fi
}

proctype Relay(byte r) {
	byte snap[NSHARD];      /* the leases this relay believes it holds: shard -> token */
	byte bat[BATCH];        /* the claimed rows, in id order */
	byte nb, i, tgt, ep;
restart:
	atomic { snap[0] = 0; snap[1] = 0; nb = 0; i = 0; bat[0] = 0; bat[1] = 0; tgt = 0; ep = 0 }
end_relay:
	do
#ifndef PARALLEL_RELAYS
	/* the lease round: take a free or expired shard; renew; give one back */
	:: atomic { TAKEABLE(0) -> take(0) }
	:: atomic { TAKEABLE(1) -> take(1) }
	:: atomic { STALE(0) -> renew(0) }
	:: atomic { STALE(1) -> renew(1) }
	:: atomic { releases < MAXRELEASE && snap[0] != 0 && lease_owner[0] == r+1 && lease_tok[0] == snap[0] && lease_share[0] == 0 ->
		releases++; lease_owner[0] = 0; lease_exp[0] = 0; snap[0] = 0; COMMIT1; printf("MSC: relay %d gives shard 0 back\n", r) }
#endif
	/* a batch: claim (one statement), publish in id order, mark (commit) */
	:: atomic {
		(CAN(0) || CAN(1) || CAN(2)) ->
		i = 0;
		do
		:: i < NROWS && nb < BATCH -> if :: CAN(i) -> bat[nb] = i; nb++; ob_lock[i] = r+1 :: else fi; i++
		:: else -> break
		od;
		i = 0;
		tx_alive[r] = 1;
#if !defined(PARALLEL_RELAYS) && !defined(UNFENCED_LEASE)
		if :: OWNS(0) -> lease_share[0] = r+1 :: else fi;
		if :: OWNS(1) -> lease_share[1] = r+1 :: else fi;
#endif
		MARK(tgt, ob_n, ep);
		if
		:: nb == 1 -> printf("MSC: relay %d claims row %d\n", r, bat[0])
		:: else -> printf("MSC: relay %d claims rows %d and %d\n", r, bat[0], bat[1])
		fi
#ifdef MARK_BEFORE_PUBLISH
		; commit_marks() /* control: the mark committed before the rows are sent */
#endif
	};
		CRASH(after_claim_before_publish, relay_die(), restart);
#if GATE
		/* the claim was marked (ep); the rows committed before the wait */
		if
		:: atomic { epoch == ep && rep_n >= tgt -> printf("MSC: relay %d: the standby holds its rows\n", r) }
		:: atomic { epoch != ep -> printf("MSC: relay %d: the primary changed before the standby held its rows: the batch fails, nothing sent\n", r);
			abort_tx(r); nb = 0; i = 0; bat[0] = 0; bat[1] = 0; tgt = 0; ep = 0 }; goto end_relay
		fi;
#endif
		do
		:: i < nb -> atomic { printf("MSC: relay %d publishes row %d\n", r, bat[i]); append(bat[i], GOOD); i++ }
		:: atomic { i == 0 && nb > 0 && pubfails < MAXPUBFAIL -> pubfails++;
			printf("MSC: relay %d: publishing row %d fails (the broker is down): nothing sent, the claim rolls back\n", r, bat[i]);
			abort_tx(r); nb = 0; i = 0; bat[0] = 0; bat[1] = 0; tgt = 0; ep = 0 }; goto end_relay
		:: else -> i = 0; break
		od;
		CRASH(after_publish_before_mark, relay_die(), restart);
		atomic {
#ifndef MARK_BEFORE_PUBLISH
			commit_marks();
#endif
			nb = 0; i = 0; bat[0] = 0; bat[1] = 0; tgt = 0; ep = 0
		}
	od
}

/* ================= row 2: the broker ================= */
/* What row 1 proves of the partition: every committed row gets a copy,
 * the first copies of a key in commit order (rows 0 and 2: order 0), and
 * a copy may come again (a batch republished after after-publish-before-
 * mark or a paused relay). */
proctype Broker() {
end_broker:
	do
	:: atomic { !inlog[0] -> printf("MSC: broker: row 0 at offset %d\n", log_n); append(0, GOOD) }
	:: atomic { !inlog[1] -> printf("MSC: broker: row 1 at offset %d\n", log_n); append(1, GOOD) }
	:: atomic { !inlog[2] && inlog[0] -> printf("MSC: broker: row 2 at offset %d\n", log_n); append(2, GOOD) }
	:: atomic { dups < MAXDUP && inlog[0] -> dups++; printf("MSC: broker: row 0 again at offset %d\n", log_n); append(0, GOOD) }
	:: atomic { dups < MAXDUP && inlog[1] -> dups++; printf("MSC: broker: row 1 again at offset %d\n", log_n); append(1, GOOD) }
	:: atomic { dups < MAXDUP && inlog[2] -> dups++; printf("MSC: broker: row 2 again at offset %d\n", log_n); append(2, GOOD) }
	od
}

/* ================= row 2: the hostile producer ================= */
proctype Hostile() {
	bool c, p, s;
	do
	:: atomic { !c && inlog[0] -> c = 1; printf("MSC: hostile: id 0 again with another payload, at offset %d\n", log_n); append(0, BAD) }
	:: atomic { !p -> p = 1; printf("MSC: hostile: a poison message (id %d) at offset %d\n", POISON, log_n); append(POISON, GOOD) }
	:: atomic { !s && inlog[0] -> s = 1; printf("MSC: hostile: a second decision for order 0 (id %d) at offset %d\n", SECOND, log_n); append(SECOND, GOOD) }
	:: c && p && s -> break
	od
}

/* ================= row 2: the consumer: inbox and handler ================= */
/* the handler's writes, committed with the inbox row */
inline apply(id, pay) {
	if :: applied[id] > 0 -> twice = 1; CHECK_once :: else fi;
	applied[id]++;
	if :: pay != firstpay[id] -> conflict_applied = 1; CHECK_conflict :: else fi;
	if :: (id) < NROWS && pay == GOOD -> got[id] = 1 :: else fi;
	if
	:: DECIDES(id) ->
#ifndef GUARD_OFF
		if
		:: decided[KEY(id)] != 0 -> printf("MSC: guard refuses message %d: order %d already decided\n", id, KEY(id))
		:: else ->
#endif
			printf("MSC: message %d decides order %d\n", id, KEY(id));
			if :: decided[KEY(id)] != 0 -> decided_twice = 1; CHECK_guard :: else fi;
			decided[KEY(id)] = id + 1;
			if :: effect[KEY(id)] == NONE -> effect[KEY(id)] = PENDING; eff_due[KEY(id)] = 1 :: else fi
#ifndef GUARD_OFF
		fi
#endif
	:: else
	fi
}

/* row 2: the offset is committed past messages whose inbox rows are all
 * there */
inline check_lost() {
#ifdef FAILOVER
	j = 0;
	do
	:: j < committed_off -> if :: inbox[log_id[j]] == 0 -> lost = 1; printf("MSC: offset %d is committed, but message %d's inbox row is gone: lost\n", j, log_id[j]); CHECK_lost :: else fi; j++
	:: else -> break
	od;
	j = 0
#else
	skip
#endif
}

proctype Consumer() {
	byte pos, id;
	bit pay;
	bool fresh;
	byte tgt, ep; /* the gate's: the commits made, and the timeline, of the transaction that settled the message */
restart:
	atomic { pos = committed_off; id = 0; pay = 0; fresh = 0; tgt = 0; ep = 0; printf("MSC: consumer (re)starts at the committed offset %d\n", pos) }
end_consumer:
	do
	:: atomic { pos < log_n -> id = log_id[pos]; pay = log_pay[pos]; printf("MSC: consumer gets offset %d: message %d payload %d\n", pos, id, pay) }
#ifdef COMMIT_BEFORE_TX
		atomic { committed_off = pos + 1; printf("MSC: consumer commits offset %d before its transaction\n", pos + 1) }
#endif
deliver:	/* the handler is called with the message (again, after a failed commit) */
		CRASH(before_begin, skip, restart);
attempt:	/* one transaction: the inbox row, the handler, the commit */
		if
		:: atomic { dbfails < MAXDBFAIL -> dbfails++;
			printf("MSC: the transaction of message %d fails (the database went away): nothing written, the message is handled again\n", id) };
			goto deliver
		:: true
		fi;
#ifndef INBOX_OFF
		atomic {
			ep = epoch; /* the transaction's timeline */
			if
			:: inbox[id] == 0 -> fresh = 1
			:: inbox[id] == pay + 1 -> fresh = 0; printf("MSC: inbox: message %d is a duplicate\n", id)
			:: inbox[id] != 0 && inbox[id] != pay + 1 -> fresh = 0; printf("MSC: inbox: message %d conflicts: quarantined\n", id)
			fi
		};
		if
		:: fresh -> CRASH(after_inbox_insert, skip, restart)
		:: else ->
#if GATE
			tgt = c2;
#endif
			goto settled /* its transaction commits what the inbox records of it; nothing applied */
		fi;
#else
		fresh = 1;
#endif
		if
		:: id == POISON ->
			/* the handler fails: rolled back; the attempt counted on its own */
			atomic { attempts[id]++; COMMIT2; printf("MSC: handler fails on message %d: attempt %d\n", id, attempts[id]) };
			if
			:: attempts[id] >= MAXATT ->
				atomic { inbox[id] = pay + 1; dead[id] = 1; fresh = 0; COMMIT2; tgt = c2; ep = epoch; printf("MSC: message %d dead-lettered\n", id) };
				goto ack
			:: else -> goto attempt
			fi
		:: else ->
			CRASH(after_handler_before_commit, skip, restart);
			if
			:: atomic {
#ifdef FAILOVER
				epoch == ep ->
#endif
#ifndef INBOX_OFF
				inbox[id] = pay + 1;
#endif
				apply(id, pay); fresh = 0; COMMIT2; tgt = c2;
				printf("MSC: consumer commits message %d\n", id)
			}
#ifdef FAILOVER
			:: atomic { epoch != ep -> fresh = 0;
				printf("MSC: the commit of message %d fails: its session died with the old primary; the message is delivered again\n", id) };
				goto deliver
#endif
			:: atomic { dbfails < MAXDBFAIL -> dbfails++; fresh = 0;
				printf("MSC: the commit of message %d fails (the database went away): nothing written, the message is delivered again\n", id) };
				goto deliver
			:: atomic { dbfails < MAXDBFAIL -> dbfails++; fresh = 0;
				printf("MSC: the commit of message %d fails (a batch's, or refused): nothing written, the message is tried again in a transaction of its own\n", id) };
				goto attempt
			fi
		fi;
settled:
		CRASH(after_commit_before_ack, skip, restart);
ack:
#if GATE
		if
		:: atomic { epoch == ep && rep_c2 >= tgt -> printf("MSC: the standby holds message %d's transaction\n", id) }
		:: atomic { epoch != ep -> printf("MSC: the primary changed before the standby held message %d's transaction: not acknowledged, delivered again\n", id) }; goto deliver
		fi;
#endif
		/* the ack marks the offset; Sarama commits marked offsets now and
		 * then: here, or with a later ack (a crash before it redelivers) */
		if
		:: atomic { pos++; committed_off = pos; id = 0; pay = 0; tgt = 0; ep = 0; printf("MSC: consumer acks; offset %d committed\n", pos); check_lost() }
		:: atomic { pos++; id = 0; pay = 0; tgt = 0; ep = 0; printf("MSC: consumer acks; offset %d not committed yet\n", pos) }
		fi
	od
}

/* ================= row 3: the decisions' capture intents ================= */
/* What row 2 gives the effects table: each decided order's capture
 * recorded in the decision's transaction, once per key (EnqueueTx: a second
 * one with the key records nothing). */
proctype Enqueuer() {
	do
	:: atomic { effect[0] == NONE -> effect[0] = PENDING; eff_due[0] = 1; printf("MSC: order 0 decided: capture-0 recorded\n") }
	:: atomic { effect[1] == NONE -> effect[1] = PENDING; eff_due[1] = 1; printf("MSC: order 1 decided: capture-1 recorded\n") }
	:: effect[0] != NONE && effect[1] != NONE -> break
	od
}

/* ================= row 3: the effect runners and the provider ================= */
#ifdef NO_EFFECT_LEASE
#define runner_die() skip /* control: the claim is never given back */
#else
#define runner_die() eff_due[o] = 1 /* its lease expires; another runner claims it */
#endif

/* POST /v1/captures */
inline call(n, o) {
#ifndef NO_EFFECT_KEY
	if
	:: !pkey[o] -> pkey[o] = 1; captures[o]++; printf("MSC: runner %d calls: the provider captures order %d, stores key capture-%d\n", n, o, o)
	:: else -> printf("MSC: runner %d calls: the provider replays the stored response of capture-%d\n", n, o)
	fi;
#else
	captures[o]++; printf("MSC: runner %d calls without a key: the provider captures order %d (capture %d)\n", n, o, captures[o]);
#endif
	if :: captures[o] > 1 -> captured_twice = 1; CHECK_capture :: else fi
}

proctype Runner(byte n) {
	byte o;
restart:
	o = 0;
end_runner:	/* claim a due capture: its lease begins (Runner.claim) */
	if
	:: atomic { effect[0] == PENDING && eff_due[0] -> o = 0; eff_due[0] = 0; printf("MSC: runner %d claims capture-0\n", n) }
	:: atomic { effect[1] == PENDING && eff_due[1] -> o = 1; eff_due[1] = 0; printf("MSC: runner %d claims capture-1\n", n) }
	fi;
	CRASH(before_effect, runner_die(), restart);
	if
	:: atomic { pfails < MAXPFAIL -> pfails++; eff_due[o] = 1;
		printf("MSC: runner %d calls: the provider fails before doing anything; capture-%d is due again after a backoff\n", n, o); o = 0 };
		goto restart
	:: atomic { pfails < MAXPFAIL -> pfails++; call(n, o); eff_due[o] = 1;
		printf("MSC: runner %d: the answer is lost; capture-%d is due again after a backoff\n", n, o); o = 0 };
		goto restart
	:: atomic { call(n, o) }
	fi;
	CRASH(after_effect_before_record, runner_die(), restart);
	atomic { /* record: the first record wins */
		if :: effect[o] == PENDING -> effect[o] = DONE; printf("MSC: runner %d records capture-%d done\n", n, o)
		:: else -> printf("MSC: runner %d: capture-%d was recorded already\n", n, o)
		fi;
		o = 0
	};
	goto restart
}

/* ================= the standby and the failover (-DFAILOVER, rows 1 and 2) ================= */
#ifdef FAILOVER
/* the standby promoted: what it did not hold is gone; every session dies
 * with the old primary; the failover outlasts every lease */
inline failover1() {
	ob_n = rep_n;
	j = 0;
	do
	:: j < NROWS -> ob_pub[j] = rep_pub[j]; ob_lock[j] = 0; if :: inlog[j] && j >= ob_n -> ghost = 1; printf("MSC: row %d is on the partition, but the failover took it back: a ghost\n", j); CHECK_ghost :: else fi; j++
	:: else -> break
	od;
	j = 0;
	paid[0] = rep_paid[0]; paid[1] = rep_paid[1];
	lease_owner[0] = rep_owner[0]; lease_owner[1] = rep_owner[1];
	lease_tok[0] = rep_tok[0]; lease_tok[1] = rep_tok[1];
	lease_exp[0] = (lease_owner[0] != 0); lease_exp[1] = (lease_owner[1] != 0);
	lease_share[0] = 0; lease_share[1] = 0;
	tx_alive[0] = 0; tx_alive[1] = 0;
	dirty1 = 0;
	if :: (answered[0] && !paid[0]) || (answered[1] && !paid[1]) -> answer_lost = 1; printf("MSC: a payment the client was told of is gone\n"); CHECK_answer :: else fi
}
inline failover2() {
	j = 0;
	do
	:: j < NIDS -> inbox[j] = rep_inbox[j]; dead[j] = rep_dead[j]; attempts[j] = rep_attempts[j]; applied[j] = rep_applied[j]; j++
	:: else -> break
	od;
	j = 0;
	do
	:: j < NROWS -> got[j] = rep_got[j]; j++
	:: else -> break
	od;
	j = 0;
	decided[0] = rep_decided[0]; decided[1] = rep_decided[1];
	effect[0] = rep_effect[0]; effect[1] = rep_effect[1];
	eff_due[0] = (effect[0] == PENDING); eff_due[1] = (effect[1] == PENDING);
	c2 = rep_c2;
	check_lost()
}

proctype Standby() {
end_standby:
	do
#ifndef SYNC_REPL
#if ROW == 1
	:: atomic { dirty1 -> replicate1(); printf("MSC: the standby catches up\n") }
#else
	:: atomic { rep_c2 < c2 -> replicate2(); printf("MSC: the standby catches up\n") }
#endif
#endif
	:: atomic { failovers < MAXFAILOVER -> failovers++; epoch++;
		printf("MSC: failover: the standby is promoted, what it did not hold is gone\n");
#if ROW == 1
		failover1()
#else
		failover2()
#endif
	}
	od
}
#endif

/* ================= the environment (rows 1 and 3) ================= */
#if ROW != 2
proctype Env() {
end_env:
	do
#if ROW == 1
	:: atomic { pauses < MAXPAUSE && tx_alive[0] -> pauses++; abort_tx(0); printf("MSC: relay 0 paused: the fence ends its session\n") }
	:: atomic { pauses < MAXPAUSE && tx_alive[1] -> pauses++; abort_tx(1); printf("MSC: relay 1 paused: the fence ends its session\n") }
#ifndef PARALLEL_RELAYS
	:: atomic { expiries < MAXEXPIRE && lease_owner[0] != 0 && !lease_exp[0] -> expiries++; lease_exp[0] = 1; printf("MSC: the lease of shard 0 expires\n") }
	:: atomic { expiries < MAXEXPIRE && lease_owner[1] != 0 && !lease_exp[1] -> expiries++; lease_exp[1] = 1; printf("MSC: the lease of shard 1 expires\n") }
#endif
#endif
#if ROW == 3
	:: atomic { effloss < MAXEFFLOSS && effect[0] == PENDING && !eff_due[0] -> effloss++; eff_due[0] = 1; printf("MSC: the lease on capture-0 expires under its runner\n") }
	:: atomic { effloss < MAXEFFLOSS && effect[1] == PENDING && !eff_due[1] -> effloss++; eff_due[1] = 1; printf("MSC: the lease on capture-1 expires under its runner\n") }
#endif
	od
}
#endif

init {
	atomic {
#if ROW == 1
		run Producer(); run Relay(0); run Relay(1); run Env();
#elif ROW == 2
		run Broker(); run Hostile(); run Consumer();
#else
		run Enqueuer(); run Runner(0); run Runner(1); run Env()
#endif
#if defined(FAILOVER) && ROW != 3
		run Standby()
#endif
	}
}

/* ---- the liveness properties (pan -a -f -N name); the safety ones are
 * the assertions above (CHECK_*) ---- */
ltl published { <> (inlog[0] && inlog[1] && inlog[2]) }  /* row 1: every committed row reaches the partition */
ltl delivered { <> (got[0] && got[1] && got[2] && dead[POISON]) } /* row 2: every committed row applied with its payload, the poison message dead-lettered */
ltl captured  { <> (effect[0] == DONE && effect[1] == DONE) } /* row 3: every capture performed and recorded */
