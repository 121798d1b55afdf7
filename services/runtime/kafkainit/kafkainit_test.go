package kafkainit

import (
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParse(t *testing.T) {
	full := map[string]string{
		"KAFKA_BROKERS": "kafka:9092", "KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "admin", "KAFKA_SASL_PASSWORD": "a",
		"ORDERS_KAFKA_PASSWORD": "o", "INVENTORY_KAFKA_PASSWORD": "i", "DEMO_KAFKA_PASSWORD": "d", "DASHBOARD_KAFKA_PASSWORD": "b",
	}
	p, err := Parse([]string{"-topics", "a, b", "-partitions", "3"}, env(full))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(p.Topics, ",") != "a,b" || p.Partitions != 3 || p.ReplicationFactor != 1 || p.Admin.Mechanism != "PLAIN" {
		t.Fatalf("plan %+v", p)
	}
	if len(p.Principals) != len(Names) {
		t.Fatalf("%d principals, want %d", len(p.Principals), len(Names))
	}
	for _, pr := range p.Principals {
		if pr.Login.Password != full[PasswordEnv(pr.Login.Username)] || len(pr.Grants) == 0 {
			t.Errorf("principal %s: password %q, %d grants", pr.Login.Username, pr.Login.Password, len(pr.Grants))
		}
	}

	// With a superuser, every principal needs its password.
	short := map[string]string{}
	for k, v := range full {
		short[k] = v
	}
	delete(short, "DEMO_KAFKA_PASSWORD")
	if _, err := Parse(nil, env(short)); err == nil || !strings.Contains(err.Error(), "DEMO_KAFKA_PASSWORD") {
		t.Errorf("a missing password: %v", err)
	}
	// A half-set superuser login, no brokers, a bad count: refused.
	for name, m := range map[string]map[string]string{
		"no password":   {"KAFKA_BROKERS": "k:1", "KAFKA_SASL_USERNAME": "admin"},
		"no brokers":    {},
		"bad mechanism": {"KAFKA_BROKERS": "k:1", "KAFKA_SASL_USERNAME": "admin", "KAFKA_SASL_PASSWORD": "a", "KAFKA_SASL_MECHANISM": "GSSAPI"},
	} {
		if _, err := Parse(nil, env(m)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Parse([]string{"-partitions", "0"}, env(full)); err == nil {
		t.Error("-partitions 0: no error")
	}
	// No superuser: topics only.
	p, err = Parse(nil, env(map[string]string{"KAFKA_BROKERS": "k:1"}))
	if err != nil || len(p.Principals) != 0 || len(p.Topics) != 6 {
		t.Errorf("no login: %+v, %v", p, err)
	}
}
