package platform

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// The metric names GET /metrics serves (documented in docs/operate.md).
const (
	metricInboxMessages      = "inbox_messages_total"
	metricHandlerDuration    = "inbox_handler_duration_seconds"
	metricCommitToApply      = "inbox_commit_to_apply_seconds"
	metricHeldKeys           = "inbox_held_keys"
	metricParkedMessages     = "inbox_parked_messages"
	metricContinuity         = "inbox_continuity_breaches_total"
	metricSkippedRecords     = "inbox_skipped_records_total"
	metricSkippedUnrepaired  = "inbox_skipped_ranges_unrepaired"
	metricEffectsPending     = "effects_pending"
	metricEffectsRetrying    = "effects_retrying"
	metricEffectsFailed      = "effects_failed"
	metricEffectOldestAge    = "effects_oldest_pending_age_seconds"
	metricPendingRows        = "outbox_pending_rows"
	metricOldestPendingAge   = "outbox_oldest_pending_age_seconds"
	metricPendingQueryErrors = "outbox_pending_query_errors_total"
	metricParkedRows         = "outbox_parked_rows"
	metricRelayParked        = "outbox_relay_parked_total"
	metricRelayed            = "outbox_relayed_total"
	metricRelayBatches       = "outbox_relay_batches_total"
	metricRelayErrors        = "outbox_relay_errors_total"
	metricRetentionDeleted   = "outbox_retention_deleted_total"
	metricShardsOwned        = "outbox_relay_shards_owned"
	metricShards             = "outbox_relay_shards"
	metricGroupLag           = "kafka_consumer_group_lag"
	metricGroupCommitted     = "kafka_consumer_group_committed_offset"
	metricPrimaryUp          = "database_primary_up"
	metricStandbyWaiting     = "database_standby_waiting"
	metricStandbyReleased    = "database_standby_released_total"
	metricStandbyChanged     = "database_standby_primary_changed_total"
)

// pendingQueryTimeout bounds the outbox query a scrape runs: a slow database
// must not hold up the scrape, the gauges are left out instead.
const pendingQueryTimeout = 2 * time.Second

// latencyBuckets span a fast local apply (a millisecond) to a stalled
// pipeline (a minute), in seconds.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// metrics is one service's Prometheus registry. It counts inbox outcomes
// (from Inbox.Stats), times deliveries (from inbox.Config.OnOutcome), measures
// commit-to-apply latency (from the outbox_created_at metadata PublishTx
// stamps), and reads the outbox backlog from the database on each scrape.
type metrics struct {
	pool            *pgxpool.Pool
	log             *slog.Logger
	reg             *prometheus.Registry
	handlerDuration *prometheus.HistogramVec
	commitToApply   *prometheus.HistogramVec
	groupLag        *prometheus.GaugeVec
	groupCommitted  *prometheus.GaugeVec

	// createdAt holds, per message id, when the message being handled was
	// written to the producer's outbox, from the handler run until the
	// delivery is settled.
	createdAt sync.Map
}

func newMetrics(pool *pgxpool.Pool, log *slog.Logger) *metrics {
	m := &metrics{
		pool: pool,
		log:  log,
		reg:  prometheus.NewRegistry(),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricHandlerDuration,
			Help:    "Time from delivery to settlement of a message in the inbox middleware (inbox transaction, handler, commit, retries), by outcome.",
			Buckets: latencyBuckets,
		}, []string{"consumer", "outcome"}),
		commitToApply: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricCommitToApply,
			Help:    "Time from the producer's outbox write (its transaction's commit) to the consumer's committed apply.",
			Buckets: latencyBuckets,
		}, []string{"consumer"}),
		groupLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metricGroupLag,
			Help: "Records past the consumer group's committed offset, per partition of the topic it consumes, as the stall watchdog last read them (every replica reads the whole group).",
		}, []string{"group", "topic", "partition"}),
		groupCommitted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metricGroupCommitted,
			Help: "The consumer group's committed offset per partition, as the stall watchdog last read it: with lag, an offset that does not move is a group making no progress.",
		}, []string{"group", "topic", "partition"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.handlerDuration, m.commitToApply, m.groupLag, m.groupCommitted,
		newOutboxCollector(pool, log),
	)
	return m
}

// register adds the counters kept by the inbox and the relay.
func (m *metrics) register(ibx *inbox.Inbox, relay *outbox.Relay, shards int) {
	relayCounter := func(name, help string, v func(outbox.RelayStats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(v(relay.Stats())) })
	}
	m.reg.MustRegister(
		inboxCollector{ibx},
		holdCollector{pool: m.pool, log: m.log, consumer: ibx.Consumer()},
		continuityCollector{pool: m.pool, log: m.log, consumer: ibx.Consumer()},
		skippedCollector{pool: m.pool, log: m.log, consumer: ibx.Consumer()},
		relayCounter(metricRelayed, "Outbox rows published and marked by this process's relay.",
			func(s outbox.RelayStats) int64 { return s.Published }),
		relayCounter(metricRelayBatches, "Relay transactions that published at least one row.",
			func(s outbox.RelayStats) int64 { return s.Batches }),
		relayCounter(metricRelayErrors, "Relay batches that failed; their rows are published by a later batch.",
			func(s outbox.RelayStats) int64 { return s.Errors }),
		relayCounter(metricRelayParked, "Outbox rows this process's relay parked because the broker will never take them (see outboxctl).",
			func(s outbox.RelayStats) int64 { return s.Parked }),
		relayCounter(metricRetentionDeleted, "Published outbox rows deleted by retention.",
			func(s outbox.RelayStats) int64 { return s.Deleted }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricShardsOwned,
			Help: "Outbox shards this process's relay holds the lease of now (RELAY_SHARDS > 1; 0 otherwise). Summed over replicas it is RELAY_SHARDS when every shard has an owner."},
			func() float64 { return float64(relay.Stats().Shards) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricShards,
			Help: "The shards this service's outbox is divided into (RELAY_SHARDS; 0 when one relay leads)."},
			func() float64 {
				if shards > 1 {
					return float64(shards)
				}
				return 0
			}),
	)
}

// registerDatabase adds the database's state: whether a primary answers
// (the last probe, every second), and the standby gate's waits
// (DATABASE_STANDBYS; zero without it).
func (m *metrics) registerDatabase(primary *primaryWatch, gate *standby.Gate) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricPrimaryUp,
			Help: "1 when the service's database answered as a writable primary at the last probe (every second); 0 while none does: failing over, or down."},
			func() float64 {
				if primary.up() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricStandbyWaiting,
			Help: "What waits now for the database's standbys to hold its transaction (DATABASE_STANDBYS): answers, batches, acknowledgements, calls. Growing: the standbys stopped streaming."},
			func() float64 { return float64(gate.Stats().Waiting) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metricStandbyReleased,
			Help: "Waits the standbys released (DATABASE_STANDBYS)."},
			func() float64 { return float64(gate.Stats().Released) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metricStandbyChanged,
			Help: "Waits failed because the primary changed before its standbys held the transaction: a failover; what waited is retried (DATABASE_STANDBYS)."},
			func() float64 { return float64(gate.Stats().PrimaryChanged) }),
	)
}

// onGroupRead is inboxkafka.WatchdogConfig.OnRead: each reading of the
// consumer group becomes its lag and committed offset gauges.
func (m *metrics) onGroupRead(group, topic string) func([]inboxkafka.PartitionLag) {
	return func(lags []inboxkafka.PartitionLag) {
		for _, l := range lags {
			p := strconv.Itoa(int(l.Partition))
			m.groupLag.WithLabelValues(group, topic, p).Set(float64(l.Lag()))
			m.groupCommitted.WithLabelValues(group, topic, p).Set(float64(l.Committed))
		}
	}
}

// registerEffects adds the backlog of each kind of effect.
func (m *metrics) registerEffects(effects []Effects) {
	var kinds []string
	for _, e := range effects {
		kinds = append(kinds, e.Kind)
	}
	if len(kinds) > 0 {
		m.reg.MustRegister(effectCollector{pool: m.pool, log: m.log, kinds: kinds})
	}
}

// handler serves the registry.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// handling is called by the consumer handler, inside the inbox transaction,
// just before the service's Handle: it remembers when the message was
// written to the producer's outbox.
func (m *metrics) handling(msg *message.Message) {
	if t, ok := outbox.CreatedAt(msg); ok {
		m.createdAt.Store(msg.UUID, t)
	}
}

// onOutcome returns an inbox.Config.OnOutcome that records e and then calls
// next (the logger).
func (m *metrics) onOutcome(next func(inbox.Event)) func(inbox.Event) {
	return func(e inbox.Event) {
		m.handlerDuration.WithLabelValues(e.Consumer, string(e.Outcome)).Observe(e.Duration.Seconds())
		if created, ok := m.createdAt.LoadAndDelete(e.MessageID); ok && e.Outcome == inbox.Applied {
			m.commitToApply.WithLabelValues(e.Consumer).Observe(time.Since(created.(time.Time)).Seconds())
		}
		if next != nil {
			next(e)
		}
	}
}

// inboxCollector reports Inbox.Stats as one counter with an outcome label.
type inboxCollector struct{ ibx *inbox.Inbox }

var inboxMessagesDesc = prometheus.NewDesc(metricInboxMessages,
	"Deliveries settled by the inbox, by outcome: applied, duplicate (suppressed), conflict and invalid (quarantined), dead_lettered, retried (failed attempts), and parked (behind a held key, INBOX_ON_DEAD_LETTER=hold).",
	[]string{"consumer", "outcome"}, nil)

func (c inboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- inboxMessagesDesc }

func (c inboxCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.ibx.Stats()
	for _, o := range []struct {
		outcome inbox.Outcome
		n       int64
	}{
		{inbox.Applied, s.Applied}, {inbox.Duplicate, s.Duplicates}, {inbox.Conflict, s.Conflicts},
		{inbox.Invalid, s.Invalid}, {inbox.DeadLettered, s.DeadLettered}, {inbox.Retried, s.Retries},
		{inbox.Parked, s.Parked},
	} {
		ch <- prometheus.MustNewConstMetric(inboxMessagesDesc, prometheus.CounterValue, float64(o.n), c.ibx.Consumer(), string(o.outcome))
	}
}

// outboxCollector reads the outbox backlog on each scrape. The query uses the
// partial index on pending rows, so it stays cheap however many published
// rows wait for retention.
type outboxCollector struct {
	pool   *pgxpool.Pool
	log    *slog.Logger
	errors prometheus.Counter
}

var (
	pendingRowsDesc = prometheus.NewDesc(metricPendingRows,
		"Outbox rows committed but not yet published (every replica of the service reports the same database).", nil, nil)
	oldestPendingDesc = prometheus.NewDesc(metricOldestPendingAge,
		"Age of the oldest unpublished outbox row, in seconds; 0 when none is pending.", nil, nil)
	parkedRowsDesc = prometheus.NewDesc(metricParkedRows,
		"Outbox rows parked because the broker will never take them; each holds back its key's later rows until an operator retries or drops it (outboxctl).", nil, nil)
)

func newOutboxCollector(pool *pgxpool.Pool, log *slog.Logger) *outboxCollector {
	return &outboxCollector{pool: pool, log: log, errors: prometheus.NewCounter(prometheus.CounterOpts{
		Name: metricPendingQueryErrors,
		Help: "Scrapes whose outbox backlog query failed or timed out; " + metricPendingRows + " is missing from those.",
	})}
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingRowsDesc
	ch <- oldestPendingDesc
	ch <- parkedRowsDesc
	c.errors.Describe(ch)
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), pendingQueryTimeout)
	defer cancel()
	var pending, parked int64
	var age float64
	err := c.pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE parked_at IS NOT NULL),
		       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
		FROM outbox_messages WHERE published_at IS NULL`, PlanEachTime).Scan(&pending, &parked, &age)
	if err != nil {
		c.errors.Inc()
		c.log.Warn("metrics: reading the outbox backlog", "err", err)
	} else {
		ch <- prometheus.MustNewConstMetric(pendingRowsDesc, prometheus.GaugeValue, float64(pending))
		ch <- prometheus.MustNewConstMetric(oldestPendingDesc, prometheus.GaugeValue, max(age, 0))
		ch <- prometheus.MustNewConstMetric(parkedRowsDesc, prometheus.GaugeValue, float64(parked))
	}
	c.errors.Collect(ch)
}

// effectCollector reads each kind of effect's backlog on each scrape
// (effect.ReadStats: the pending rows through their partial index, and a
// count of the ended ones).
type effectCollector struct {
	pool  *pgxpool.Pool
	log   *slog.Logger
	kinds []string
}

var (
	effectsPendingDesc = prometheus.NewDesc(metricEffectsPending,
		"Effects outside the database (payment captures, refunds) recorded and not yet ended: called, retried or waiting for their first call.", []string{"kind"}, nil)
	effectsRetryingDesc = prometheus.NewDesc(metricEffectsRetrying,
		"Pending effects whose last call failed and that wait for their next (the provider answers 5xx, times out, or holds the key).", []string{"kind"}, nil)
	effectsFailedDesc = prometheus.NewDesc(metricEffectsFailed,
		"Effects that ended failed for good (a request the provider can never accept); each order's payment_error says why.", []string{"kind"}, nil)
	effectOldestDesc = prometheus.NewDesc(metricEffectOldestAge,
		"Age of the oldest pending effect, in seconds; 0 when none is pending.", []string{"kind"}, nil)
)

func (c effectCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- effectsPendingDesc
	ch <- effectsRetryingDesc
	ch <- effectsFailedDesc
	ch <- effectOldestDesc
}

func (c effectCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), pendingQueryTimeout)
	defer cancel()
	for _, kind := range c.kinds {
		s, err := effect.ReadStats(ctx, c.pool, kind)
		if err != nil {
			c.log.Warn("metrics: reading the effects backlog", "kind", kind, "err", err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(effectsPendingDesc, prometheus.GaugeValue, float64(s.Pending), kind)
		ch <- prometheus.MustNewConstMetric(effectsRetryingDesc, prometheus.GaugeValue, float64(s.Retrying), kind)
		ch <- prometheus.MustNewConstMetric(effectsFailedDesc, prometheus.GaugeValue, float64(s.Failed), kind)
		ch <- prometheus.MustNewConstMetric(effectOldestDesc, prometheus.GaugeValue, s.OldestPending.Seconds(), kind)
	}
}

// holdCollector reads the consumer's held keys and parked messages on each
// scrape (inboxadmin.Admin.HoldStats: two index scans of tables that are empty unless
// INBOX_ON_DEAD_LETTER=hold held a key). Both are 0 with the hold off.
type holdCollector struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	consumer string
}

var (
	heldKeysDesc = prometheus.NewDesc(metricHeldKeys,
		"Partition keys the consumer holds: a message of each was dead-lettered and the key's later messages are parked until an operator redrives or discards it (inboxctl held).",
		[]string{"consumer"}, nil)
	parkedMessagesDesc = prometheus.NewDesc(metricParkedMessages,
		"Messages parked behind held keys, recorded and acknowledged but not applied yet.",
		[]string{"consumer"}, nil)
)

func (c holdCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- heldKeysDesc
	ch <- parkedMessagesDesc
}

func (c holdCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), pendingQueryTimeout)
	defer cancel()
	n, err := inboxadmin.New(c.pool).HoldStats(ctx, c.consumer)
	if err != nil {
		c.log.Warn("metrics: counting held keys", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(heldKeysDesc, prometheus.GaugeValue, float64(n.Keys), c.consumer)
	ch <- prometheus.MustNewConstMetric(parkedMessagesDesc, prometheus.GaugeValue, float64(n.Parked), c.consumer)
}

// continuityCollector counts the consumer's continuity breaches on each
// scrape (inboxadmin.Admin.Continuity: an index scan of a table that stays empty
// while every producer's history reaches the consumer whole).
type continuityCollector struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	consumer string
}

var continuityDesc = prometheus.NewDesc(metricContinuity,
	"Breaks in a producer key's history the consumer saw (inbox_continuity_breaches; inboxctl breaches), by kind: gap (numbers skipped: events that had not arrived), rewind (a number again under a new id: the producer's database went back in time) and late (a skipped number that came after all, filling its gap).",
	[]string{"consumer", "kind"}, nil)

func (c continuityCollector) Describe(ch chan<- *prometheus.Desc) { ch <- continuityDesc }

func (c continuityCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), pendingQueryTimeout)
	defer cancel()
	n, err := inboxadmin.New(c.pool).Continuity(ctx, c.consumer)
	if err != nil {
		c.log.Warn("metrics: counting continuity breaches", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(continuityDesc, prometheus.CounterValue, float64(n.Gaps), c.consumer, string(inbox.Gap))
	ch <- prometheus.MustNewConstMetric(continuityDesc, prometheus.CounterValue, float64(n.Rewinds), c.consumer, string(inbox.Rewind))
	ch <- prometheus.MustNewConstMetric(continuityDesc, prometheus.CounterValue, float64(n.Late), c.consumer, string(inbox.Late))
}

// skippedCollector counts, on each scrape, the records the broker lost
// under the consumer (inboxadmin.Admin.Skipped: a table that stays empty
// while Kafka keeps what it acknowledged).
type skippedCollector struct {
	pool     *pgxpool.Pool
	log      *slog.Logger
	consumer string
}

var (
	skippedRecordsDesc = prometheus.NewDesc(metricSkippedRecords,
		"Records the consumer never read because the broker no longer held them (inbox_skipped_ranges; inboxctl skipped): deleted past its committed offset (retention, kafka-delete-records), or its log truncated below it (the topic recreated, an unclean leader election).",
		[]string{"consumer"}, nil)
	skippedUnrepairedDesc = prometheus.NewDesc(metricSkippedUnrepaired,
		"Skipped ranges the producer has not sent again yet (docs/broker-loss.md).",
		[]string{"consumer"}, nil)
)

func (c skippedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- skippedRecordsDesc
	ch <- skippedUnrepairedDesc
}

func (c skippedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), pendingQueryTimeout)
	defer cancel()
	n, err := inboxadmin.New(c.pool).Skipped(ctx, c.consumer)
	if err != nil {
		c.log.Warn("metrics: counting skipped records", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(skippedRecordsDesc, prometheus.CounterValue, float64(n.Records), c.consumer)
	ch <- prometheus.MustNewConstMetric(skippedUnrepairedDesc, prometheus.GaugeValue, float64(n.Unrepaired), c.consumer)
}
