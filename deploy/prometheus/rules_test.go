// Package prometheus holds the Prometheus configuration of
// docker-compose.yml's "observe" profile; its test checks the rules with
// promtool, as Prometheus would load them, and runs their unit tests.
package prometheus

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// promtool returns promtool's path; without it the test is skipped, unless
// REQUIRE_PROMTOOL=1 (CI) makes that a failure.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("REQUIRE_PROMTOOL") == "1" {
			t.Fatal("promtool not found, and REQUIRE_PROMTOOL=1 (apt-get install prometheus)")
		}
		t.Skip("promtool not found (apt-get install prometheus); skipping the rules' checks")
	}
	return path
}

// TestRules: the config and its rules load, and every alert fires where
// alerts_test.yml says it must and stays quiet in its control cases.
func TestRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "config", "prometheus.yml"}, // and the rule files it names
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var alertName = regexp.MustCompile(`(?m)^\s*- alert: (\w+)\s*$`)

// TestEveryAlertHasATestAndARunbook: each alert of alerts.yml is exercised by
// alerts_test.yml and has its runbook section in docs/operate.md.
func TestEveryAlertHasATestAndARunbook(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	rules, tests, runbook := read("alerts.yml"), read("alerts_test.yml"), read("../../docs/operate.md")
	alerts := alertName.FindAllStringSubmatch(rules, -1)
	if len(alerts) < 5 {
		t.Fatalf("found %d alerts in alerts.yml", len(alerts))
	}
	for _, m := range alerts {
		name := m[1]
		if !strings.Contains(tests, "alertname: "+name+"\n") {
			t.Errorf("alert %s has no case in alerts_test.yml", name)
		}
		if !strings.Contains(runbook, "\n### "+name+"\n") {
			t.Errorf("alert %s has no runbook section (### %s) in docs/operate.md", name, name)
		}
		if !strings.Contains(rules, "docs/operate.md#"+strings.ToLower(name)+`"`) {
			t.Errorf("alert %s's runbook annotation does not point at its section", name)
		}
	}
}
