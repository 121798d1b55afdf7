// Package kafkainit prepares a Kafka cluster for the example system, as
// docker-compose.yml's kafka-init job does (cmd/kafka-init): it creates the
// topics, then one principal per client with exactly the ACLs that client
// needs, logged in as the cluster's superuser. Every step is idempotent:
// run again, it changes nothing a client could see (a password is set to
// what the environment says).
//
// The principals, and what each may do:
//
//	orders     write "orders.*"; read inventory.events; group orders
//	inventory  write "inventory.*"; read orders.events; group inventory
//	demo       write orders.events (its replay of a published OrderPaid)
//	dashboard  describe both events topics and both groups (offsets, lag)
//
// orders' and inventory's are kafkaconf.ServiceGrants, the grants the test
// stacks and the chaos proof give the same services.
package kafkainit

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// Plan is what Run does.
type Plan struct {
	Brokers           []string
	Admin             kafkaconf.Credentials // a superuser's login; empty: the cluster asks for none
	Topics            []string
	Partitions        int32
	ReplicationFactor int16
	Principals        []Principal // created only when Admin is set
	Timeout           time.Duration
}

// Principal is one client's login and what it may do.
type Principal struct {
	Login  kafkaconf.Credentials
	Grants []kafkaconf.Grant
}

// PasswordEnv is the variable that holds the password of principal name:
// ORDERS_KAFKA_PASSWORD for orders.
func PasswordEnv(name string) string { return strings.ToUpper(name) + "_KAFKA_PASSWORD" }

// Names are the principals Parse creates, in order.
var Names = []string{"orders", "inventory", "demo", "dashboard"}

// Grants are what principal name (one of Names) may do.
func Grants(name string) []kafkaconf.Grant {
	describe := []sarama.AclOperation{sarama.AclOperationDescribe}
	switch name {
	case "orders":
		return kafkaconf.ServiceGrants("orders", events.TopicInventory)
	case "inventory":
		return kafkaconf.ServiceGrants("inventory", events.TopicOrders)
	case "demo":
		return []kafkaconf.Grant{{Resource: sarama.AclResourceTopic, Name: events.TopicOrders,
			Ops: []sarama.AclOperation{sarama.AclOperationWrite, sarama.AclOperationDescribe}}}
	case "dashboard":
		return []kafkaconf.Grant{
			{Resource: sarama.AclResourceTopic, Name: events.TopicOrders, Ops: describe},
			{Resource: sarama.AclResourceTopic, Name: events.TopicInventory, Ops: describe},
			{Resource: sarama.AclResourceGroup, Name: "orders", Ops: describe},
			{Resource: sarama.AclResourceGroup, Name: "inventory", Ops: describe},
		}
	}
	return nil
}

// Parse reads a Plan from args (flags) and getenv: KAFKA_BROKERS, the
// superuser's login in KAFKA_SASL_*, and each principal's password in
// <NAME>_KAFKA_PASSWORD (all of them, when the superuser logs in).
func Parse(args []string, getenv func(string) string) (Plan, error) {
	fs := flag.NewFlagSet("kafka-init", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	topics := fs.String("topics", strings.Join([]string{events.TopicOrders, events.TopicInventory, "orders.dlq", "inventory.dlq", kafkaconf.RedriveTopic("orders"), kafkaconf.RedriveTopic("inventory")}, ","), "topics to create, comma-separated")
	partitions := fs.Int("partitions", 6, "partitions of each topic")
	rf := fs.Int("replication-factor", 1, "replicas of each partition")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the cluster")
	if err := fs.Parse(args); err != nil {
		return Plan{}, err
	}
	if fs.NArg() > 0 {
		return Plan{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *partitions < 1 || *rf < 1 {
		return Plan{}, fmt.Errorf("-partitions %d, -replication-factor %d: want at least 1", *partitions, *rf)
	}
	p := Plan{Partitions: int32(*partitions), ReplicationFactor: int16(*rf), Timeout: *timeout}
	for _, t := range strings.Split(*topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			p.Topics = append(p.Topics, t)
		}
	}
	for _, b := range strings.Split(getenv("KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			p.Brokers = append(p.Brokers, b)
		}
	}
	if len(p.Brokers) == 0 {
		return Plan{}, errors.New("KAFKA_BROKERS is empty")
	}
	admin, err := kafkaconf.CredentialsFrom(getenv)
	if err != nil {
		return Plan{}, err
	}
	p.Admin = admin
	if admin.Empty() {
		return p, nil
	}
	var missing []string
	for _, name := range Names {
		pw := getenv(PasswordEnv(name))
		if pw == "" {
			missing = append(missing, PasswordEnv(name))
			continue
		}
		p.Principals = append(p.Principals, Principal{Login: kafkaconf.Credentials{Mechanism: kafkaconf.ScramSHA512, Username: name, Password: pw}, Grants: Grants(name)})
	}
	if len(missing) > 0 {
		return Plan{}, fmt.Errorf("%s: empty; each principal needs a password", strings.Join(missing, ", "))
	}
	return p, nil
}

// Run carries out p, saying what it did on out.
func Run(ctx context.Context, p Plan, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	ca, err := connect(ctx, p.Brokers, p.Admin)
	if err != nil {
		return err
	}
	defer ca.Close()
	for _, t := range p.Topics {
		err := ca.CreateTopic(t, &sarama.TopicDetail{NumPartitions: p.Partitions, ReplicationFactor: p.ReplicationFactor}, false)
		switch {
		case err == nil:
			fmt.Fprintf(out, "topic %s: created, %d partitions, replication factor %d\n", t, p.Partitions, p.ReplicationFactor)
		case errors.Is(err, sarama.ErrTopicAlreadyExists):
			fmt.Fprintf(out, "topic %s: exists\n", t)
		default:
			return fmt.Errorf("creating topic %s: %w", t, err)
		}
	}
	if err := waitTopics(ctx, ca, p.Topics, p.Partitions); err != nil {
		return err
	}
	for _, pr := range p.Principals {
		if err := kafkaconf.CreatePrincipal(ca, pr.Login, pr.Grants); err != nil {
			return err
		}
	}
	for _, pr := range p.Principals {
		if err := waitLogin(ctx, p.Brokers, pr.Login); err != nil {
			return err
		}
		fmt.Fprintf(out, "principal %s: logs in; may %s\n", pr.Login.Username, describe(pr.Grants))
	}
	if p.Admin.Empty() {
		fmt.Fprintln(out, "no superuser login (KAFKA_SASL_* unset): no principal created")
	}
	return nil
}

// connect opens an admin client as admin, retrying until ctx ends: the
// broker may still be starting.
func connect(ctx context.Context, brokers []string, admin kafkaconf.Credentials) (sarama.ClusterAdmin, error) {
	conf := kafkaconf.SaramaAs(admin)
	conf.Net.DialTimeout = 3 * time.Second
	for {
		ca, err := sarama.NewClusterAdmin(brokers, conf)
		if err == nil {
			return ca, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to %s as %q: %w", strings.Join(brokers, ","), admin.Username, errors.Join(err, ctx.Err()))
		case <-time.After(time.Second):
		}
	}
}

// waitTopics waits until every topic is in the metadata with at least
// partitions partitions; one that has fewer (made by hand, or by a client
// before this job) is an error that says so.
func waitTopics(ctx context.Context, ca sarama.ClusterAdmin, topics []string, partitions int32) error {
	for {
		metas, err := ca.DescribeTopics(topics)
		ready := err == nil
		for _, m := range metas {
			switch {
			case m.Err != sarama.ErrNoError:
				ready = false
			case int32(len(m.Partitions)) < partitions:
				return fmt.Errorf("topic %s has %d partitions, want %d: delete it, or raise its partitions", m.Name, len(m.Partitions), partitions)
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics %s not in the metadata: %w", strings.Join(topics, ","), errors.Join(err, ctx.Err()))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitLogin waits until login is let in and may read the cluster's
// metadata: a new SCRAM credential reaches each broker through the
// metadata log a moment after the controller accepted it.
func waitLogin(ctx context.Context, brokers []string, login kafkaconf.Credentials) error {
	conf := kafkaconf.SaramaAs(login)
	conf.Net.DialTimeout, conf.Net.ReadTimeout = 2*time.Second, 5*time.Second
	conf.Metadata.Retry.Max = 0
	for {
		var err error
		for _, addr := range brokers {
			b := sarama.NewBroker(addr)
			if err = b.Open(conf); err == nil {
				_, err = b.GetMetadata(&sarama.MetadataRequest{Version: 1})
				b.Close() //nolint:errcheck // a probe
			}
			if err != nil {
				break
			}
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("principal %s cannot log in: %w", login.Username, errors.Join(err, ctx.Err()))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// describe says what grants allow, briefly: "Write,Describe topic orders.*; …".
func describe(grants []kafkaconf.Grant) string {
	var parts []string
	for _, g := range grants {
		var ops []string
		for _, op := range g.Ops {
			ops = append(ops, opName(op))
		}
		name := g.Name
		if g.Prefixed {
			name += "*"
		}
		kind := map[sarama.AclResourceType]string{sarama.AclResourceTopic: "topic", sarama.AclResourceGroup: "group", sarama.AclResourceCluster: "cluster"}[g.Resource]
		parts = append(parts, strings.Join(ops, ",")+" "+kind+" "+name)
	}
	return strings.Join(parts, "; ")
}

func opName(op sarama.AclOperation) string {
	switch op {
	case sarama.AclOperationRead:
		return "Read"
	case sarama.AclOperationWrite:
		return "Write"
	case sarama.AclOperationDescribe:
		return "Describe"
	case sarama.AclOperationDescribeConfigs:
		return "DescribeConfigs"
	}
	return fmt.Sprint(int(op))
}
