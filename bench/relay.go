package main

// The relay-only benchmark (bench -relay; #16 item 3): how fast an outbox
// drains into the broker, and how long a committed row waits to be
// published, for
//
//   - forwarder:       Watermill's Forwarder (components/forwarder) with
//     watermill-sql's Postgres subscriber at its defaults (1s poll, 100 rows
//     a query) and watermill-kafka's Publisher, one synchronous send per
//     message: the outbox as Watermill ships it;
//   - forwarder_tuned: the same, at its best settings here: a 10ms poll and
//     1,000 rows a query;
//   - relay_1, relay_2, relay_3: pkg/outbox's Relay with outboxkafka's
//     batching Publisher, as the services run it, with 1, 2 and 3 replicas
//     (2 and 3 sharded: RelayConfig.Shards = 8), each replica with its own
//     pool, in this process.
//
// Drain: the relays run (sharded ones holding their shares), then Rows
// messages are committed in one transaction; the figure is Rows divided by
// the time from that commit until a consumer has read them all.
// CPU is this process's (the relays, the consumer, and kfake when it is the
// broker), every postgres process's and Apache Kafka's JVM's, per 10,000
// messages. Latency: messages are committed at Rate per second for
// LatencyFor seconds while the relays run; each one's wait is the time from
// its commit to the consumer reading it.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxref/outbox-inbox/chaos/progress"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// relayParams sizes the relay benchmark.
type relayParams struct {
	Rows       int     `json:"rows"`       // prefilled, drained
	Rate       float64 `json:"rate"`       // messages/s offered in the latency phase
	LatencyFor float64 `json:"latency_s"`  // seconds of the latency phase
	Partitions int     `json:"partitions"` // of the topic
	Keys       int     `json:"keys"`       // partition keys the messages spread over
	Rounds     int     `json:"rounds"`
}

// RelayResult is one relay build's figures on one broker (medians over rounds).
type RelayResult struct {
	Build         string      `json:"build"`
	Kafka         string      `json:"kafka"`
	MsgsPerS      float64     `json:"msgs_per_s"`
	CPUSPer10000  float64     `json:"cpu_s_per_10000"`
	CPU           cpuUse      `json:"cpu_s_per_10000_by_process"`
	LatencyMS     Percentiles `json:"commit_to_published_ms"`
	LatencyLost   int         `json:"latency_unread"`
	PerRoundMsgsS []float64   `json:"msgs_per_s_by_round"`
}

// RelayReport is bench-relay-report.json.
type RelayReport struct {
	When    string            `json:"when"`
	Machine map[string]string `json:"machine"`
	Params  relayParams       `json:"params"`
	Results []RelayResult     `json:"results"`
	// Ratios per broker: relay_1 / forwarder_tuned (goal ≥ 3) and
	// relay_2 / relay_1 (goal: two replicas no slower than one, within 5%
	// of noise).
	Ratios map[string]float64 `json:"ratios"`
	Goals  map[string]bool    `json:"goals"`
	Notes  string             `json:"notes"`
}

var relayBuilds = []string{"forwarder", "forwarder_tuned", "relay_1", "relay_2", "relay_3"}

func runRelayBench(ctx context.Context, smoke bool, kafkaFlag string, rounds int, say func(string, ...any)) error {
	p := relayParams{Rows: 20_000, Rate: 500, LatencyFor: 6, Partitions: 12, Keys: 1000, Rounds: max(1, rounds)}
	if smoke {
		p.Rows, p.LatencyFor, p.Rounds = 1_000, 1, 1
	}
	brokers, _, err := chooseBrokers(ctx, kafkaFlag, say)
	if err != nil {
		return err
	}
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop() //nolint:errcheck
	rep := RelayReport{When: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Params: p,
		Ratios: map[string]float64{}, Goals: map[string]bool{}}
	steps, step, began := len(brokers)*len(relayBuilds)*p.Rounds, 0, time.Now()
	for _, impl := range brokers {
		k, err := stack.StartKafka(ctx, stack.KafkaOptions{Impl: impl, Nodes: 1, Partitions: p.Partitions})
		if err != nil {
			return err
		}
		var brokerPids []int
		if a := k.Apache(); a != nil {
			for _, n := range a.Nodes() {
				brokerPids = append(brokerPids, n.Pid())
			}
		}
		byBuild := map[string][]RelayResult{}
		for round := range p.Rounds {
			for _, b := range relayBuilds { // alternating: the machine's noise hits each alike
				step++
				say("[step %d of %d%s] %s on %s, round %d", step, steps, progress.Left(step-1, steps, time.Since(began)), b, impl, round+1)
				res, err := relayRound(ctx, pg, k, brokerPids, p, b, round)
				if err != nil {
					k.Close()
					return fmt.Errorf("%s on %s: %w", b, impl, err)
				}
				say("  %s: %.0f msgs/s, %.2f CPU s per 10,000, commit→published p50 %.1f ms p99 %.1f ms",
					b, res.MsgsPerS, res.CPUSPer10000, res.LatencyMS.P50, res.LatencyMS.P99)
				byBuild[b] = append(byBuild[b], res)
			}
		}
		k.Close()
		for _, b := range relayBuilds {
			rep.Results = append(rep.Results, medianRelay(byBuild[b]))
		}
		get := func(b string) float64 { return medianRelay(byBuild[b]).MsgsPerS }
		rep.Ratios["relay_1/forwarder_tuned@"+impl] = get("relay_1") / get("forwarder_tuned")
		rep.Ratios["relay_2/relay_1@"+impl] = get("relay_2") / get("relay_1")
		rep.Ratios["relay_3/relay_1@"+impl] = get("relay_3") / get("relay_1")
		rep.Goals["relay_1 >= 3x forwarder_tuned@"+impl] = rep.Ratios["relay_1/forwarder_tuned@"+impl] >= 3
		rep.Goals["relay_2 >= 0.95 x relay_1@"+impl] = rep.Ratios["relay_2/relay_1@"+impl] >= 0.95
	}
	rep.Notes = "One machine, 2 cores: replicas share the CPU with Postgres, the broker and each other, so relay_2/relay_3 show the cost of sharding, not scale-out. Each drain starts once the relays run and (sharded) hold their shares: the rows are committed in one transaction and the clock runs from that commit. Postgres CPU is every postgres process on the machine."
	printRelay(rep, say)
	// The goals are reported, not enforced: one noisy machine's figures.
	return writeReport(rep, "BENCH_RELAY_REPORT", "bench-relay-report.json", say)
}

// relayRound measures one build once, on a fresh database and topic.
func relayRound(ctx context.Context, pg *pgtest.Server, k *stack.Kafka, brokerPids []int, p relayParams, b string, round int) (RelayResult, error) {
	res := RelayResult{Build: b, Kafka: k.Describe()}
	name := fmt.Sprintf("relaybench_%s_r%d_%d", b, round, time.Now().UnixNano()%1_000_000)
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		return res, err
	}
	defer dropDatabases(pg, name)
	topic := name
	if err := k.CreateTopics(ctx, p.Partitions, topic); err != nil {
		return res, err
	}
	r, err := newRelayBuild(ctx, url, k.Brokers(), b, topic)
	if err != nil {
		return res, err
	}
	defer r.close()

	// Drain: the relays run and share their shards first; then one
	// transaction commits every row at once, and the clock runs from that
	// commit until the consumer has read them all.
	c, err := newReader(k.Brokers(), topic)
	if err != nil {
		return res, err
	}
	defer c.close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := r.start(runCtx)
	if err := r.ready(ctx); err != nil {
		return res, err
	}
	ids, err := r.write(ctx, p.Rows, p.Keys, nil)
	if err != nil {
		return res, fmt.Errorf("prefilling: %w", err)
	}
	cpu0, t0 := cpuSeconds(nil, brokerPids), time.Now()
	if err := c.waitFor(ctx, ids, 5*time.Minute); err != nil {
		return res, fmt.Errorf("draining: %w", err)
	}
	took := time.Since(t0)
	cpu := cpuSeconds(nil, brokerPids).sub(cpu0)
	res.MsgsPerS = float64(p.Rows) / took.Seconds()
	res.CPU = cpu.per1000(p.Rows)
	res.CPU = cpuUse{res.CPU.Postgres * 10, res.CPU.Services * 10, res.CPU.Bench * 10, res.CPU.Broker * 10}
	res.CPUSPer10000 = res.CPU.total()
	res.PerRoundMsgsS = []float64{res.MsgsPerS}

	// Latency: a fixed offered rate while the relays run.
	committed := map[string]time.Time{}
	var mu sync.Mutex
	n := int(p.Rate * p.LatencyFor)
	lids, err := r.write(ctx, n, p.Keys, func(id string, at time.Time) {
		mu.Lock()
		committed[id] = at
		mu.Unlock()
	}, p.Rate)
	if err != nil {
		return res, fmt.Errorf("latency phase: %w", err)
	}
	c.waitFor(ctx, lids, 30*time.Second) //nolint:errcheck // an unread message counts as lost below
	var waits []float64
	for _, id := range lids {
		if at, ok := c.readAt(id); ok {
			waits = append(waits, float64(at.Sub(committed[id]).Microseconds())/1000)
		} else {
			res.LatencyLost++
		}
	}
	if len(waits) > 0 {
		res.LatencyMS = percentiles(waits)
	}
	stop()
	<-done
	return res, nil
}

// relayBuild is one configuration under test: how rows are committed and
// what publishes them.
type relayBuild struct {
	name   string
	acked  *ackLog // for the relays: when Kafka acknowledged each message
	write  func(ctx context.Context, n, keys int, onCommit func(string, time.Time), rate ...float64) ([]string, error)
	start  func(ctx context.Context) <-chan struct{}
	ready  func(ctx context.Context) error // after start: the relays share their shards
	closes []func()
}

func (r *relayBuild) close() {
	for i := len(r.closes) - 1; i >= 0; i-- {
		r.closes[i]()
	}
}

func newRelayBuild(ctx context.Context, url string, brokers []string, b, topic string) (*relayBuild, error) {
	r := &relayBuild{name: b}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	r.closes = append(r.closes, pool.Close)
	logger := watermill.NopLogger{}
	if strings.HasPrefix(b, "forwarder") {
		// The Forwarder's own table (watermill-sql's schema), written through
		// forwarder.Publisher in the producer's transaction.
		schema := wsql.DefaultPostgreSQLSchema{}
		poll := time.Duration(0) // watermill-sql's default, 1s
		if b == "forwarder_tuned" {
			schema.SubscribeBatchSize, poll = 1000, 10*time.Millisecond
		}
		fwdTopic := "forwarder_" + topic
		// The table first, outside any producer's transaction.
		initSub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
			SchemaAdapter: schema, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, InitializeSchema: true}, logger)
		if err != nil {
			r.close()
			return nil, err
		}
		if err := initSub.SubscribeInitialize(fwdTopic); err != nil {
			r.close()
			return nil, fmt.Errorf("creating the forwarder's table: %w", err)
		}
		initSub.Close() //nolint:errcheck
		r.write = func(ctx context.Context, n, keys int, onCommit func(string, time.Time), rate ...float64) ([]string, error) {
			return writeRows(ctx, pool, n, keys, onCommit, rate, func(tx pgx.Tx, msgs []*message.Message) error {
				sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema}, logger)
				if err != nil {
					return err
				}
				return forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: fwdTopic}).Publish(topic, msgs...)
			})
		}
		// Set up before the clock starts, as the relays' publishers are.
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
			SchemaAdapter: schema, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{}, PollInterval: poll}, logger)
		if err != nil {
			r.close()
			return nil, err
		}
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers,
			Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey), OverwriteSaramaConfig: kafkaconf.Sarama()}, logger)
		if err != nil {
			r.close()
			return nil, err
		}
		r.closes = append(r.closes, func() { pub.Close() })
		fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: fwdTopic})
		if err != nil {
			r.close()
			return nil, err
		}
		r.start = func(ctx context.Context) <-chan struct{} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				fwd.Run(ctx) //nolint:errcheck // ends with ctx
			}()
			return done
		}
		r.ready = func(ctx context.Context) error {
			select {
			case <-fwd.Running():
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return r, nil
	}
	replicas := int(b[len(b)-1] - '0')
	r.acked = &ackLog{at: map[string]time.Time{}}
	if err := outbox.Migrate(ctx, pool); err != nil {
		r.close()
		return nil, err
	}
	r.write = func(ctx context.Context, n, keys int, onCommit func(string, time.Time), rate ...float64) ([]string, error) {
		return writeRows(ctx, pool, n, keys, onCommit, rate, func(tx pgx.Tx, msgs []*message.Message) error {
			return outbox.PublishTx(ctx, tx, topic, msgs...)
		})
	}
	var relays []*outbox.Relay
	for i := range replicas {
		rpool, err := pgxpool.New(ctx, url)
		if err != nil {
			r.close()
			return nil, err
		}
		r.closes = append(r.closes, rpool.Close)
		pub, err := outboxkafka.New(outboxkafka.Config{Brokers: brokers, Sarama: kafkaconf.Sarama(), Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)})
		if err != nil {
			r.close()
			return nil, err
		}
		r.closes = append(r.closes, func() { pub.Close() })
		cfg := outbox.RelayConfig{Pool: rpool, Publisher: ackingPublisher{pub, r.acked}, RelayID: fmt.Sprintf("bench-%d", i+1)}
		if replicas > 1 {
			cfg.Shards, cfg.LeaseTTL = 8, time.Second
		}
		relay, err := outbox.NewRelay(cfg)
		if err != nil {
			r.close()
			return nil, err
		}
		relays = append(relays, relay)
	}
	r.start = func(ctx context.Context) <-chan struct{} {
		done := make(chan struct{})
		var wg sync.WaitGroup
		for _, relay := range relays {
			wg.Add(1)
			go func() { defer wg.Done(); relay.Run(ctx) }() //nolint:errcheck // returns nil at shutdown
		}
		go func() { wg.Wait(); close(done) }()
		return done
	}
	r.ready = func(ctx context.Context) error {
		if replicas == 1 {
			return nil
		}
		// Every replica holds its share (8 over 2 or 3: at least 2 each).
		deadline := time.Now().Add(time.Minute)
		for {
			spread := true
			for _, relay := range relays {
				spread = spread && relay.Stats().Shards >= 8/replicas
			}
			if spread {
				return nil
			}
			if time.Now().After(deadline) {
				return errors.New("the replicas did not share the shards within a minute")
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return r, nil
}

// ackLog notes when each message's Publish returned: Kafka acknowledged it.
type ackLog struct {
	mu sync.Mutex
	at map[string]time.Time // first acknowledgement
}

func (l *ackLog) snapshot() map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.at)
}

// ackingPublisher is a relay's publisher that notes each acknowledgement
// in log; errors pass through as they are (the relay classifies them).
type ackingPublisher struct {
	message.Publisher
	log *ackLog
}

func (p ackingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	for _, m := range msgs {
		if _, ok := p.log.at[m.UUID]; !ok {
			p.log.at[m.UUID] = now
		}
	}
	return nil
}

// writeRows commits n messages over keys partition keys, all in one
// transaction (one a transaction when a rate is given, paced to it),
// through publish, and returns their ids; onCommit, when set, learns each
// one's commit time.
func writeRows(ctx context.Context, pool *pgxpool.Pool, n, keys int, onCommit func(string, time.Time), rate []float64,
	publish func(pgx.Tx, []*message.Message) error) ([]string, error) {
	per := n
	var tick *time.Ticker
	if len(rate) > 0 && rate[0] > 0 {
		per = 1
		tick = time.NewTicker(time.Duration(float64(time.Second) / rate[0]))
		defer tick.Stop()
	}
	var ids []string
	for i := 0; i < n; i += per {
		if tick != nil {
			select {
			case <-ctx.Done():
				return ids, ctx.Err()
			case <-tick.C:
			}
		}
		var msgs []*message.Message
		for j := i; j < min(n, i+per); j++ {
			msgs = append(msgs, outbox.NewMessage(fmt.Sprintf("key-%d", j%keys), []byte(`{"n":`+fmt.Sprint(j)+`}`)))
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return publish(tx, msgs) }); err != nil {
			return ids, err
		}
		at := time.Now()
		for _, m := range msgs {
			ids = append(ids, m.UUID)
			if onCommit != nil {
				onCommit(m.UUID, at)
			}
		}
	}
	return ids, nil
}

// reader consumes a topic from its start and notes when each message id
// was first read.
type reader struct {
	client *kgo.Client
	mu     sync.Mutex
	seen   map[string]time.Time
	stop   context.CancelFunc
	done   chan struct{}
}

func newReader(brokers []string, topic string) (*reader, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
		// After a leader dies, look for the new one within half a second
		// (franz-go's default waits up to 5 s between metadata reads): the
		// figures are the relay's, not this reader's.
		kgo.MetadataMinAge(500 * time.Millisecond)}
	if login := kafkaconf.Current(); !login.Empty() { // the stack's brokers ask for one (SCRAM-SHA-512)
		auth := scram.Auth{User: login.Username, Pass: login.Password}
		mech := auth.AsSha512Mechanism()
		if login.Mechanism == kafkaconf.ScramSHA256 {
			mech = auth.AsSha256Mechanism()
		}
		opts = append(opts, kgo.SASL(mech))
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &reader{client: client, seen: map[string]time.Time{}, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			fetches := client.PollFetches(ctx)
			now := time.Now()
			c.mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "_watermill_message_uuid" {
						if _, ok := c.seen[string(h.Value)]; !ok {
							c.seen[string(h.Value)] = now
						}
					}
				}
			})
			c.mu.Unlock()
		}
	}()
	return c, nil
}

func (c *reader) readAt(id string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.seen[id]
	return at, ok
}

// waitFor waits until every id was read.
func (c *reader) waitFor(ctx context.Context, ids []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		missing := 0
		for _, id := range ids {
			if _, ok := c.seen[id]; !ok {
				missing++
			}
		}
		c.mu.Unlock()
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d messages not read within %s", missing, len(ids), timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// count is how many distinct messages were read.
func (c *reader) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// snapshot copies when each message was first read.
func (c *reader) snapshot() map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.seen)
}

func (c *reader) close() {
	c.stop()
	<-c.done
	c.client.Close()
}

// medianRelay is each figure's median over rounds, field by field, with
// every round's msgs/s.
func medianRelay(rounds []RelayResult) RelayResult {
	med := func(f func(RelayResult) float64) float64 {
		v := make([]float64, len(rounds))
		for i, r := range rounds {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	m := RelayResult{Build: rounds[0].Build, Kafka: rounds[0].Kafka}
	m.MsgsPerS = med(func(r RelayResult) float64 { return r.MsgsPerS })
	m.CPUSPer10000 = med(func(r RelayResult) float64 { return r.CPUSPer10000 })
	m.CPU = cpuUse{
		Postgres: med(func(r RelayResult) float64 { return r.CPU.Postgres }),
		Services: med(func(r RelayResult) float64 { return r.CPU.Services }),
		Bench:    med(func(r RelayResult) float64 { return r.CPU.Bench }),
		Broker:   med(func(r RelayResult) float64 { return r.CPU.Broker }),
	}
	m.LatencyMS = Percentiles{
		P50: med(func(r RelayResult) float64 { return r.LatencyMS.P50 }),
		P95: med(func(r RelayResult) float64 { return r.LatencyMS.P95 }),
		P99: med(func(r RelayResult) float64 { return r.LatencyMS.P99 }),
	}
	m.LatencyLost = int(med(func(r RelayResult) float64 { return float64(r.LatencyLost) }))
	for _, r := range rounds {
		m.PerRoundMsgsS = append(m.PerRoundMsgsS, r.MsgsPerS)
	}
	return m
}

func printRelay(rep RelayReport, say func(string, ...any)) {
	say("")
	say("%-16s %-24s %10s %14s %12s %12s", "build", "kafka", "msgs/s", "CPU s/10,000", "p50 ms", "p99 ms")
	for _, r := range rep.Results {
		say("%-16s %-24s %10.0f %14.2f %12.1f %12.1f", r.Build, r.Kafka, r.MsgsPerS, r.CPUSPer10000, r.LatencyMS.P50, r.LatencyMS.P99)
	}
	keys := make([]string, 0, len(rep.Ratios))
	for k := range rep.Ratios {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		say("ratio %-32s %.2f", k, rep.Ratios[k])
	}
	goals := make([]string, 0, len(rep.Goals))
	for k := range rep.Goals {
		goals = append(goals, k)
	}
	slices.Sort(goals)
	for _, g := range goals {
		verdict := "MET"
		if !rep.Goals[g] {
			verdict = "NOT MET"
		}
		say("goal  %-32s %s", g, verdict)
	}
}
