package stack

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestApacheKafkaCluster starts three real brokers and puts them through
// what the chaos harness does to them: a message survives the SIGKILL of its
// partition's leader (leadership moves), a paused node is fenced and rejoins
// when resumed, and everything acknowledged survives a full-cluster kill and
// restart on the nodes' data.
func TestApacheKafkaCluster(t *testing.T) {
	RequireApache(t)
	ctx := testCtx(t, 5*time.Minute)
	const topic = "apache-test"

	start := time.Now()
	k, err := StartKafka(ctx, KafkaOptions{Impl: ImplApache, Nodes: 3, Partitions: 3, Topics: []string{topic}, Apache: ApacheOptions{Log: t.Logf}})
	must(t, err)
	t.Cleanup(k.Close)
	c := k.Apache()
	check(t, c != nil, "no Apache cluster")
	equal(t, false, k.External())
	check(t, strings.Contains(k.Describe(), "Apache Kafka "+ApacheVersion), "Describe: %s", k.Describe())
	t.Logf("3 nodes ready in %v (%s)", time.Since(start), c.Dir())

	// The topic has replication factor 3 and min.insync.replicas 2.
	admin, err := sarama.NewClusterAdmin(c.InternalBrokers(), SaramaConfig())
	must(t, err)
	topics, err := admin.DescribeTopics([]string{topic})
	admin.Close()
	must(t, err)
	equal(t, 3, len(topics[0].Partitions))
	equal(t, 3, len(topics[0].Partitions[0].Replicas))

	pub := newPublisher(t, k)
	sent := publishN(t, pub, topic, "before", 30)

	// Kill partition 0's leader: leadership must move, and acks=all
	// publishing must go on with two of three replicas in sync.
	leader, err := c.Leader(topic, 0)
	must(t, err)
	c.Node(leader).Kill()
	check(t, !c.Node(leader).Running(), "node %d still running", leader)
	deadline := time.Now().Add(time.Minute)
	for {
		now, err := c.Leader(topic, 0)
		if err == nil && now != leader {
			t.Logf("partition 0: leader %d killed, now %d", leader, now)
			break
		}
		check(t, time.Now().Before(deadline), "leadership of partition 0 did not move from killed node %d (last %d, %v)", leader, now, err)
		time.Sleep(200 * time.Millisecond)
	}
	for id := range publishN(t, pub, topic, "one-down", 30) {
		sent[id] = true
	}
	must(t, c.Node(leader).Start())
	must(t, c.WaitReady(ctx))

	// A paused node is fenced: the metadata stops listing it.
	paused := c.Node(1 + leader%3)
	must(t, paused.Pause())
	deadline = time.Now().Add(time.Minute)
	for !fenced(c, paused.ID) {
		check(t, time.Now().Before(deadline), "paused node %d still listed after a minute", paused.ID)
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("paused node %d fenced", paused.ID)
	must(t, paused.Resume())
	must(t, c.WaitReady(ctx))

	// Kill every node at once and restart them on their data: what was
	// acknowledged is still there.
	for _, n := range c.Nodes() {
		n.Kill()
	}
	for _, n := range c.Nodes() {
		must(t, n.Start())
	}
	must(t, c.WaitReady(ctx))
	for _, n := range c.Nodes() {
		equal(t, 2, n.Starts()-boolInt(n.ID == leader))
	}
	sub := newSubscriber(t, k, "apache-test-group", SaramaConfig())
	msgs, err := sub.Subscribe(ctx, topic)
	must(t, err)
	col := newCollector()
	go col.consume(0, msgs)
	must(t, col.wait(ctx, sent))
	t.Logf("%d messages acknowledged across a leader kill, a pause and a full restart: all consumed", len(sent))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fenced reports whether the running, unpaused nodes' metadata no longer
// lists node id.
func fenced(c *ApacheCluster, id int) bool {
	client, _, err := c.client(0) // the caller polls
	if err != nil {
		return false
	}
	defer client.Close()
	for _, b := range client.Brokers() {
		if int(b.ID()) == id {
			return false
		}
	}
	return true
}

// TestApacheJarsCache: a complete cache is reused without Maven, a broken
// one (a jar cut short) is detected.
func TestApacheJarsCache(t *testing.T) {
	RequireApache(t)
	ctx := testCtx(t, 5*time.Minute)
	libs, err := ApacheJars(ctx, t.Logf)
	must(t, err)
	cache := filepath.Dir(libs)
	must(t, checkManifest(cache))

	// A copy of the cache with one jar truncated must fail the check.
	broken := t.TempDir()
	out, err := exec.Command("cp", "-a", cache+"/.", broken).CombinedOutput()
	must(t, err)
	_ = out
	jar := filepath.Join(broken, "libs", "kafka-clients-"+ApacheVersion+".jar")
	must(t, os.Truncate(jar, 10))
	err = checkManifest(broken)
	check(t, err != nil && strings.Contains(err.Error(), "kafka-clients"), "a truncated jar passed the manifest check: %v", err)

	// And a cache without its manifest (an interrupted resolution) is not
	// taken as complete.
	must(t, os.Remove(filepath.Join(broken, "manifest")))
	check(t, checkManifest(broken) != nil, "a cache without manifest passed")

	// The broken cache is replaced when used.
	if _, err := exec.LookPath("mvn"); err == nil {
		t.Setenv("STACK_KAFKA_CACHE", broken)
		libs, err := ApacheJars(context.Background(), t.Logf)
		must(t, err)
		must(t, checkManifest(filepath.Dir(libs)))
	}
}
