package stack

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// Every broker the stack starts, kfake or Apache, authenticates each
// connection with SASL/SCRAM-SHA-512 and authorizes each request by ACL,
// as a production cluster should: a client without a login is refused at
// the handshake, and a login may only do what its ACLs grant. The broker's
// one superuser is "admin", whose password is random per process; the
// process's own clients (the harness's checks, its hostile producers, the
// live page) log in as admin (kafkaconf.UseCredentials), and each service
// gets a principal of its own from AddPrincipal.

// AdminUser is the superuser of every broker the stack starts.
const AdminUser = "admin"

var admin = sync.OnceValue(func() kafkaconf.Credentials {
	return kafkaconf.Credentials{Mechanism: kafkaconf.ScramSHA512, Username: AdminUser, Password: cryptorand.Text()}
})

// AdminCredentials is the login of the superuser of every broker this
// process starts: random per process, never written to a committed file.
func AdminCredentials() kafkaconf.Credentials { return admin() }

// Grant is one ACL (kafkaconf.Grant).
type Grant = kafkaconf.Grant

// ClusterResource is the name Kafka gives the cluster resource in ACLs.
const ClusterResource = kafkaconf.ClusterResource

// Authenticated reports whether the broker asks for a login: always for a
// broker the stack started; for KAFKA_BROKERS, when KAFKA_SASL_USERNAME gives
// the harness one.
func (k *Kafka) Authenticated() bool { return !k.admin.Empty() }

// Admin is the login the harness uses on this broker (empty when the
// external broker asks for none).
func (k *Kafka) Admin() kafkaconf.Credentials { return k.admin }

// AddPrincipal creates user with a fresh random password (SCRAM-SHA-512,
// through the admin API's AlterUserScramCredentials) and grants it exactly
// grants (CreateACLs); nothing else is allowed to it. It returns the login
// to give the process that is to act as user. On a broker that asks for no
// login it creates nothing and returns empty credentials.
func (k *Kafka) AddPrincipal(ctx context.Context, user string, grants ...Grant) (kafkaconf.Credentials, error) {
	if !k.Authenticated() {
		return kafkaconf.Credentials{}, nil
	}
	if user == "" || user == AdminUser {
		return kafkaconf.Credentials{}, fmt.Errorf("stack: principal %q: want a name of its own", user)
	}
	creds := kafkaconf.Credentials{Mechanism: kafkaconf.ScramSHA512, Username: user, Password: cryptorand.Text()}
	ca, err := sarama.NewClusterAdmin(k.DirectBrokers(), kafkaconf.SaramaAs(k.admin))
	if err != nil {
		return kafkaconf.Credentials{}, fmt.Errorf("stack: admin client: %w", err)
	}
	defer ca.Close()
	if err := kafkaconf.CreatePrincipal(ca, creds, grants); err != nil {
		return kafkaconf.Credentials{}, err
	}
	if err := k.waitLogin(ctx, creds); err != nil {
		return kafkaconf.Credentials{}, err
	}
	return creds, nil
}

// waitLogin waits until every node that runs lets creds in: a new SCRAM
// credential reaches each broker through the metadata log, a moment after
// the controller accepted it. A node the harness killed or paused learns it
// from the log when it is back.
func (k *Kafka) waitLogin(ctx context.Context, creds kafkaconf.Credentials) error {
	ctx, cancel := withDefaultTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		last = nil
		for _, addr := range k.liveBrokers() {
			conf := kafkaconf.SaramaAs(creds)
			conf.Net.DialTimeout, conf.Net.ReadTimeout = 2*time.Second, 5*time.Second
			conf.Metadata.Retry.Max = 0
			b := sarama.NewBroker(addr)
			if err := b.Open(conf); err != nil {
				last = err
				break
			}
			_, err := b.GetMetadata(&sarama.MetadataRequest{Version: 1})
			b.Close() //nolint:errcheck
			if err != nil {
				last = fmt.Errorf("%s: %w", addr, err)
				break
			}
		}
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack: principal %s cannot log in: %w", creds.Username, errors.Join(last, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// apacheAuth is the security of every Apache node: SASL on every listener,
// SCRAM-SHA-512 for clients and between brokers (admin's SCRAM credential is
// written into the metadata log when storage is formatted, so brokers log in
// before any other user exists), PLAIN between brokers and controllers (SCRAM
// credentials live in the metadata log the controllers serve, so the
// controller listener cannot depend on them), StandardAuthorizer with admin
// the only superuser, and nothing allowed that no ACL allows.
func apacheAuth(admin kafkaconf.Credentials) map[string]string {
	q := strconv.Quote
	return map[string]string{
		"sasl.enabled.mechanisms":                               kafkaconf.ScramSHA512,
		"sasl.mechanism.inter.broker.protocol":                  kafkaconf.ScramSHA512,
		"sasl.mechanism.controller.protocol":                    "PLAIN",
		"listener.name.controller.sasl.enabled.mechanisms":      "PLAIN",
		"listener.name.controller.plain.sasl.jaas.config":       "org.apache.kafka.common.security.plain.PlainLoginModule required username=" + q(admin.Username) + " password=" + q(admin.Password) + " user_" + admin.Username + "=" + q(admin.Password) + ";",
		"listener.name.internal.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required username=" + q(admin.Username) + " password=" + q(admin.Password) + ";",
		"listener.name.client.scram-sha-512.sasl.jaas.config":   "org.apache.kafka.common.security.scram.ScramLoginModule required;",
		"authorizer.class.name":                                 "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
		"super.users":                                           "User:" + admin.Username,
		"allow.everyone.if.no.acl.found":                        "false",
	}
}

// liveBrokers are DirectBrokers less an Apache cluster's nodes that are
// down or paused.
func (k *Kafka) liveBrokers() []string {
	if k.apache == nil {
		return k.DirectBrokers()
	}
	var out []string
	for _, n := range k.apache.nodes {
		if n.Running() && !n.Paused() {
			out = append(out, n.internal)
		}
	}
	return out
}
