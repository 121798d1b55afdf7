package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/outboxref/outbox-inbox/chaos/procs"
)

// netFaults stands Shopify's toxiproxy, in process, between the services and
// their infrastructure: one proxy in front of Postgres and one in front of
// each Kafka node's CLIENT listener (the brokers advertise the proxies, so
// the services' clients reach every node through one). The harness's own
// SQL and Kafka clients go around the proxies. One fault at a time is put on
// one proxy, held for a second or three, and taken off.
type netFaults struct {
	server *toxiproxy.ApiServer
	rng    *rand.Rand
	say    func(string, ...any)

	mu      sync.Mutex                  // guards rng and proxies
	proxies map[string]*toxiproxy.Proxy // "postgres", "kafka-1", …
	tally                               // "<target>_<kind>" → times applied
}

// The network faults, each on one proxy at a time.
const (
	netLatency    = "latency"     // 150 ms ± 50 each way: slow, not broken
	netBlackhole  = "blackhole"   // nothing passes either way; the connections are closed when it ends
	netReset      = "reset"       // every connection that sends is reset (RST)
	netAnswerLost = "answer_lost" // requests reach the server, its answers are dropped, then the connection closes
)

var netKinds = []string{netLatency, netBlackhole, netReset, netAnswerLost}

func newNetFaults(seed uint64, say func(string, ...any)) *netFaults {
	return &netFaults{
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		rng:     rand.New(rand.NewPCG(seed, 0x7e7)),
		say:     say,
		proxies: map[string]*toxiproxy.Proxy{},
	}
}

// proxy starts a proxy named name in front of upstream and returns its
// listen address.
func (n *netFaults) proxy(name, upstream string) (string, error) {
	listen, err := procs.FreeAddr()
	if err != nil {
		return "", err
	}
	p := toxiproxy.NewProxy(n.server, name, listen, upstream)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("proxy %s: %w", name, err)
	}
	n.mu.Lock()
	n.proxies[name] = p
	n.mu.Unlock()
	return listen, nil
}

// postgresURL returns dbURL with its host:port replaced by the Postgres
// proxy's, starting the proxy on first use.
func (n *netFaults) postgresURL(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL
	}
	n.mu.Lock()
	p := n.proxies["postgres"]
	n.mu.Unlock()
	listen := ""
	if p != nil {
		listen = p.Listen
	} else if listen, err = n.proxy("postgres", u.Host); err != nil {
		n.say("postgres proxy: %v (services connect directly)", err)
		return dbURL
	}
	u.Host = listen
	return u.String()
}

// kafkaAddr is stack.ApacheOptions.AdvertiseClient: node id's CLIENT
// listener is advertised as a proxy in front of it.
func (n *netFaults) kafkaAddr(node int, addr string) string {
	listen, err := n.proxy(fmt.Sprintf("kafka-%d", node), addr)
	if err != nil {
		n.say("kafka proxy: %v (node %d advertised directly)", err, node)
		return addr
	}
	return listen
}

// kinds counts the distinct fault kinds applied, whatever their target.
func (n *netFaults) kinds() int {
	seen := map[string]bool{}
	for k := range n.counts() {
		_, kind, _ := strings.Cut(k, "_")
		seen[kind] = true
	}
	return len(seen)
}

// run applies one fault every mean interval (±50%) until ctx ends. The
// kinds and targets take turns (least applied first), so a short run still
// sees every kind on both Postgres and Kafka.
func (n *netFaults) run(ctx context.Context, mean time.Duration) {
	n.mu.Lock()
	var targets []string
	for name := range n.proxies {
		targets = append(targets, name)
	}
	n.mu.Unlock()
	if len(targets) == 0 || mean <= 0 {
		return
	}
	for {
		n.mu.Lock()
		wait := mean/2 + time.Duration(n.rng.Int64N(int64(mean)))
		kind, class := n.leastApplied()
		target := class
		if class == "kafka" {
			var nodes []string
			for _, t := range targets {
				if strings.HasPrefix(t, "kafka-") {
					nodes = append(nodes, t)
				}
			}
			target = nodes[n.rng.IntN(len(nodes))]
		}
		hold := time.Second + time.Duration(n.rng.Int64N(int64(2*time.Second)))
		p := n.proxies[target]
		n.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if p == nil {
			continue
		}
		if err := n.apply(ctx, p, kind, hold); err != nil {
			n.say("network fault %s on %s: %v", kind, target, err)
			continue
		}
		n.add(class + "_" + kind)
	}
}

// leastApplied picks the (kind, target class) applied least so far; called
// with n.mu held (for rng).
func (n *netFaults) leastApplied() (kind, class string) {
	best := -1
	for _, c := range []string{"postgres", "kafka"} {
		for _, k := range netKinds {
			if got := n.get(c + "_" + k); best < 0 || got < best || (got == best && n.rng.IntN(2) == 0) {
				best, kind, class = got, k, c
			}
		}
	}
	return kind, class
}

// apply puts one fault on p for hold and takes it off. A blackhole and a
// lost answer close every connection they touched when they end (toxiproxy's
// timeout toxic), so no client is left waiting for bytes that were dropped.
func (n *netFaults) apply(ctx context.Context, p *toxiproxy.Proxy, kind string, hold time.Duration) error {
	ms := hold.Milliseconds()
	var toxics []string
	switch kind {
	case netLatency:
		toxics = []string{
			`{"name":"lat_up","type":"latency","stream":"upstream","attributes":{"latency":150,"jitter":50}}`,
			`{"name":"lat_down","type":"latency","stream":"downstream","attributes":{"latency":150,"jitter":50}}`,
		}
	case netBlackhole:
		toxics = []string{
			fmt.Sprintf(`{"name":"hole_up","type":"timeout","stream":"upstream","attributes":{"timeout":%d}}`, ms),
			fmt.Sprintf(`{"name":"hole_down","type":"timeout","stream":"downstream","attributes":{"timeout":%d}}`, ms),
		}
	case netReset:
		toxics = []string{`{"name":"reset","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`}
	case netAnswerLost:
		toxics = []string{fmt.Sprintf(`{"name":"lost","type":"timeout","stream":"downstream","attributes":{"timeout":%d}}`, ms)}
	default:
		return fmt.Errorf("unknown network fault %q", kind)
	}
	var added []string
	defer func() {
		for _, name := range added {
			p.Toxics.RemoveToxic(context.WithoutCancel(ctx), name) //nolint:errcheck // the proxy may be gone
		}
	}()
	for _, t := range toxics {
		w, err := p.Toxics.AddToxicJson(strings.NewReader(t))
		if err != nil {
			return err
		}
		added = append(added, w.Name)
	}
	// Held a little past the timeout, so the toxic closes every connection
	// it swallowed bytes of before it is taken off.
	select {
	case <-time.After(hold + 200*time.Millisecond):
	case <-ctx.Done():
	}
	return nil
}

// close stops every proxy.
func (n *netFaults) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.proxies {
		p.Stop()
	}
}
