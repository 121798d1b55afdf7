package kafkaconf

import (
	"crypto/rand"
	"fmt"

	"github.com/IBM/sarama"
)

// Grant is one ACL: operations on a resource (a topic, a group, or the
// cluster), allowed to one principal from any host.
type Grant struct {
	Resource sarama.AclResourceType // sarama.AclResourceTopic, AclResourceGroup or AclResourceCluster
	Name     string                 // the topic or group; ClusterResource for the cluster
	Prefixed bool                   // Name is a prefix (e.g. every topic named "orders.")
	Ops      []sarama.AclOperation
}

// ClusterResource is the name Kafka gives the cluster resource in ACLs.
const ClusterResource = "kafka-cluster"

// RedriveTopic is where a service's redrives come back (inbox.Config.
// RedriveTopic): a topic of its own, read by the consumer group of the
// same name.
func RedriveTopic(service string) string { return service + ".redrive" }

// ProducedTopics are the topics a service's relay publishes to: its events
// ("<service>.events"), its dead letters (inbox.Config.DeadLetterTopic's
// default, "<service>.dlq") and its redrives. The relay keeps their rows as
// long as Kafka keeps their records (outboxkafka.CheckRetention).
func ProducedTopics(service string) []string {
	return []string{service + ".events", service + ".dlq", RedriveTopic(service)}
}

// ServiceGrants are what a service of the example system may do on Kafka:
// write the topics named after it ("<service>.": its events, its dead
// letters, its redrives, the chaos harness's probe stream) and read their
// settings (the relay checks its retention against Kafka's), read each topic
// it consumes and its redrive topic, and their settings (the inbox checks
// its retention against Kafka's), join and commit its own consumer groups
// (named as the service, and as its redrive topic), and read the brokers'
// settings. Another service's topic is not among them: a service that
// writes where it may not is refused by the broker.
func ServiceGrants(service string, consumes ...string) []Grant {
	grants := []Grant{{Resource: sarama.AclResourceTopic, Name: service + ".", Prefixed: true,
		Ops: []sarama.AclOperation{sarama.AclOperationWrite, sarama.AclOperationDescribe, sarama.AclOperationDescribeConfigs}}}
	for _, t := range append(consumes, RedriveTopic(service)) {
		grants = append(grants, Grant{Resource: sarama.AclResourceTopic, Name: t,
			Ops: []sarama.AclOperation{sarama.AclOperationRead, sarama.AclOperationDescribe, sarama.AclOperationDescribeConfigs}})
	}
	return append(grants,
		Grant{Resource: sarama.AclResourceGroup, Name: service, Ops: []sarama.AclOperation{sarama.AclOperationRead, sarama.AclOperationDescribe}},
		Grant{Resource: sarama.AclResourceGroup, Name: RedriveTopic(service), Ops: []sarama.AclOperation{sarama.AclOperationRead, sarama.AclOperationDescribe}},
		Grant{Resource: sarama.AclResourceCluster, Name: ClusterResource, Ops: []sarama.AclOperation{sarama.AclOperationDescribe, sarama.AclOperationDescribeConfigs}},
	)
}

// CreatePrincipal grants creds' principal exactly grants (CreateACLs) and
// then sets its SCRAM-SHA-512 password (AlterUserScramCredentials; an
// existing user's password is replaced), through ca, a superuser's admin
// client. The grants come first: the metadata log applies records in
// order, so a broker that lets the login in applies its ACLs too. Run again
// with the same arguments it changes nothing a client could see.
func CreatePrincipal(ca sarama.ClusterAdmin, creds Credentials, grants []Grant) error {
	if creds.Empty() || creds.Password == "" {
		return fmt.Errorf("kafkaconf: principal %q: want a name and a password", creds.Username)
	}
	var acls []*sarama.ResourceAcls
	for _, g := range grants {
		pattern := sarama.AclPatternLiteral
		if g.Prefixed {
			pattern = sarama.AclPatternPrefixed
		}
		ra := &sarama.ResourceAcls{Resource: sarama.Resource{ResourceType: g.Resource, ResourceName: g.Name, ResourcePatternType: pattern}}
		for _, op := range g.Ops {
			ra.Acls = append(ra.Acls, &sarama.Acl{Principal: creds.Principal(), Host: "*", Operation: op, PermissionType: sarama.AclPermissionAllow})
		}
		acls = append(acls, ra)
	}
	if len(acls) > 0 {
		if err := ca.CreateACLs(acls); err != nil {
			return fmt.Errorf("kafkaconf: granting %s its ACLs: %w", creds.Username, err)
		}
	}
	res, err := ca.UpsertUserScramCredentials([]sarama.AlterUserScramCredentialsUpsert{{
		Name: creds.Username, Mechanism: sarama.SCRAM_MECHANISM_SHA_512, Iterations: 4096, Salt: []byte(rand.Text()), Password: []byte(creds.Password),
	}})
	if err != nil {
		return fmt.Errorf("kafkaconf: creating principal %s: %w", creds.Username, err)
	}
	for _, r := range res {
		if r.ErrorCode != sarama.ErrNoError {
			msg := ""
			if r.ErrorMessage != nil {
				msg = *r.ErrorMessage
			}
			return fmt.Errorf("kafkaconf: creating principal %s: %v %s", creds.Username, r.ErrorCode, msg)
		}
	}
	return nil
}
