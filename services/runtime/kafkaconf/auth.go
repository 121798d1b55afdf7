package kafkaconf

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// The SASL mechanisms the project's clients speak. SCRAM keeps the password
// off the wire (the broker stores a salted hash, the client proves it knows
// the password); PLAIN sends it in the clear without TLS, and is here only
// for a broker's bootstrap superuser, whose login must work before any
// SCRAM credential exists (docker-compose.yml's admin: its broker, the
// kafka-init job, the healthcheck).
const (
	ScramSHA512 = "SCRAM-SHA-512"
	ScramSHA256 = "SCRAM-SHA-256"
	Plain       = "PLAIN"
)

// Credentials are a Kafka principal's SASL/SCRAM login. The zero value
// means no authentication.
type Credentials struct {
	Mechanism string // ScramSHA512 (the default when empty), ScramSHA256 or Plain
	Username  string
	Password  string
}

// Principal is the name the broker's ACLs know the login by: "User:<name>".
func (c Credentials) Principal() string { return "User:" + c.Username }

// Empty reports whether c asks for no authentication.
func (c Credentials) Empty() bool { return c.Username == "" }

// The environment a process takes its Kafka login from.
const (
	EnvMechanism = "KAFKA_SASL_MECHANISM"
	EnvUsername  = "KAFKA_SASL_USERNAME"
	EnvPassword  = "KAFKA_SASL_PASSWORD"
)

// CredentialsFromEnv reads KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and
// KAFKA_SASL_MECHANISM (SCRAM-SHA-512 when unset). None set means no
// authentication; a username without a password, a password without a
// username, or another mechanism is an error that names the variable.
func CredentialsFromEnv() (Credentials, error) { return CredentialsFrom(os.Getenv) }

// CredentialsFrom is CredentialsFromEnv over another environment.
func CredentialsFrom(getenv func(string) string) (Credentials, error) {
	c := Credentials{
		Mechanism: strings.TrimSpace(getenv(EnvMechanism)),
		Username:  strings.TrimSpace(getenv(EnvUsername)),
		Password:  getenv(EnvPassword),
	}
	switch {
	case c.Username == "" && c.Password == "" && c.Mechanism == "":
		return Credentials{}, nil
	case c.Username == "":
		return Credentials{}, fmt.Errorf("%s is empty but %s or %s is set: a Kafka login needs a username", EnvUsername, EnvPassword, EnvMechanism)
	case c.Password == "":
		return Credentials{}, fmt.Errorf("%s is empty: Kafka principal %q needs a password", EnvPassword, c.Username)
	}
	if err := c.check(); err != nil {
		return Credentials{}, err
	}
	c.Mechanism = c.mechanism()
	return c, nil
}

func (c Credentials) mechanism() string {
	if c.Mechanism == "" {
		return ScramSHA512
	}
	return strings.ToUpper(c.Mechanism)
}

func (c Credentials) check() error {
	if m := c.mechanism(); m != ScramSHA512 && m != ScramSHA256 && m != Plain {
		return fmt.Errorf("%s=%q: want %s, %s or %s", EnvMechanism, c.Mechanism, ScramSHA512, ScramSHA256, Plain)
	}
	return nil
}

// Env is c as a process's environment (KAFKA_SASL_*): what a harness gives
// a service it starts. Empty credentials clear all three, so a child does
// not inherit a login that is not its own.
func (c Credentials) Env() []string {
	if c.Empty() {
		return []string{EnvMechanism + "=", EnvUsername + "=", EnvPassword + "="}
	}
	return []string{EnvMechanism + "=" + c.mechanism(), EnvUsername + "=" + c.Username, EnvPassword + "=" + c.Password}
}

// Apply makes conf log in as c (SASL handshake v1); empty c leaves conf as
// it is.
func (c Credentials) Apply(conf *sarama.Config) {
	if c.Empty() {
		return
	}
	conf.Net.SASL.Enable = true
	conf.Net.SASL.Handshake = true
	conf.Net.SASL.Version = sarama.SASLHandshakeV1
	conf.Net.SASL.User = c.Username
	conf.Net.SASL.Password = c.Password
	switch c.mechanism() {
	case Plain:
		conf.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case ScramSHA256:
		conf.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		conf.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
	default:
		conf.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		conf.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
	}
}

// process is the login Sarama() uses in this process when set: a test
// harness's own, set by the stack that started the broker (UseCredentials).
var process atomic.Pointer[Credentials]

// UseCredentials makes every config Sarama() returns in this process log in
// as c, over KAFKA_SASL_*. A harness that starts an authenticating broker
// calls it with the broker's admin login, so its own clients (checks,
// hostile producers, the live page) are let in; the services it starts are
// separate processes that log in as themselves.
func UseCredentials(c Credentials) { process.Store(&c) }

// ForgetCredentials undoes UseCredentials: Sarama() logs in with
// KAFKA_SASL_* again.
func ForgetCredentials() { process.Store(nil) }

// Current is the login Sarama() applies: UseCredentials' when set,
// otherwise KAFKA_SASL_* (none when those are unset or invalid; a service
// checks them with CredentialsFromEnv before it connects).
func Current() Credentials {
	if c := process.Load(); c != nil {
		return *c
	}
	c, _ := CredentialsFromEnv()
	return c
}

// scramClient is Sarama's SCRAMClient over github.com/xdg-go/scram.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (s *scramClient) Begin(user, password, authzID string) error {
	client, err := s.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	s.conv = client.NewConversation()
	return nil
}

func (s *scramClient) Step(challenge string) (string, error) {
	if s.conv == nil {
		return "", errors.New("kafkaconf: SCRAM step before begin")
	}
	return s.conv.Step(challenge)
}

func (s *scramClient) Done() bool { return s.conv != nil && s.conv.Done() }
