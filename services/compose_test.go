// Package services_test checks docker-compose.yml against the code it runs,
// without Docker: it loads the file with compose-go (the loader Docker
// Compose itself uses) and compares it with the services' own list of
// variables, the system's topics and the Dockerfiles' base images; and
// compose_kafka_test.go boots the real broker from the kafka service's
// settings, as the apache/kafka image would, and runs the system on it.
package services_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/signature"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

const (
	composeFile  = "../docker-compose.yml"
	servicesFile = "Dockerfile"
)

// load parses compose files as `docker compose` would, with only the
// secrets `make compose-env` writes to .env set, so every other
// ${VAR:-default} takes its default: what a user gets.
func load(t *testing.T, files ...string) *types.Project {
	t.Helper()
	return loadProfiles(t, nil, files...)
}

// loadProfiles is load with the given profiles enabled ("*": all).
func loadProfiles(t *testing.T, profiles []string, files ...string) *types.Project {
	t.Helper()
	details := types.ConfigDetails{WorkingDir: "..", Environment: secrets}
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		details.ConfigFiles = append(details.ConfigFiles, types.ConfigFile{Filename: abs})
	}
	p, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.SetProjectName("outbox-inbox", true)
		o.Profiles = profiles
	})
	if err != nil {
		t.Fatalf("loading %v: %v", files, err)
	}
	return p
}

// secrets stands for the .env `make compose-env` writes (deploy/composeenv).
var secrets = types.Mapping{
	"POSTGRES_PASSWORD":        "0123456789abcdef0123456789abcdef",
	"API_TOKEN":                "api-token-0123456789abcdef",
	"PROVIDER_TOKEN":           "provider-token-0123456789abcdef",
	"KAFKA_ADMIN_PASSWORD":     "kafka-admin-0123456789abcdef",
	"ORDERS_KAFKA_PASSWORD":    "kafka-orders-0123456789abcdef",
	"INVENTORY_KAFKA_PASSWORD": "kafka-inventory-0123456789abcdef",
	"DEMO_KAFKA_PASSWORD":      "kafka-demo-0123456789abcdef",
	"DASHBOARD_KAFKA_PASSWORD": "kafka-dashboard-0123456789abcdef",
	"CONSOLE_PASSWORD":         "console-0123456789abcdef",
	"ORDERS_SIGNING_KEY":       signature.FormatKey(signature.Key{ID: "orders-1", Secret: []byte(strings.Repeat("o", signature.MinSecretBytes))}),
	"INVENTORY_SIGNING_KEY":    signature.FormatKey(signature.Key{ID: "inventory-1", Secret: []byte(strings.Repeat("i", signature.MinSecretBytes))}),
}

// TestComposeSecretsFromEnvFile: no password or key is written in the
// compose file; each comes from .env, and without it compose refuses to
// start, saying how to make one; the services get the Postgres password
// and sign with their own key, trusting the other's (the demo signs its
// replay with orders'); every server with state-changing routes has a
// credential and its clients send it; .env is never committed; and every
// published port is bound to 127.0.0.1.
func TestComposeSecretsFromEnvFile(t *testing.T) {
	raw, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`://[^:@/\s]+:([^@\s]+)@`).FindAllStringSubmatch(string(raw), -1) {
		if m[1] != "${POSTGRES_PASSWORD:?run make compose-env (it writes .env, or adds what it lacks)}" {
			t.Errorf("a URL with the password %q written in the compose file", m[1])
		}
	}
	// Inside a value too: the broker's JAAS settings name passwords.
	jaas := regexp.MustCompile(`(password|user_\w+)="([^"]*)"`).FindAllStringSubmatch(string(raw), -1)
	if len(jaas) == 0 {
		t.Error("no password=\"…\" in the kafka service's JAAS settings: this check reads nothing")
	}
	for _, m := range jaas {
		if !strings.HasPrefix(m[2], "${") || !strings.Contains(m[2], ":?") {
			t.Errorf("%s=%q is written in the compose file, not required from .env", m[1], m[2])
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*(\w*(PASSWORD|SECRET|KEYS?|TOKEN))\s*:\s*(.*)$`).FindAllStringSubmatch(string(raw), -1) {
		if !strings.HasPrefix(m[3], "${") || !strings.Contains(m[3], ":?") {
			t.Errorf("%s is set in the compose file (%q), not required from .env", m[1], m[3])
		}
	}

	details := types.ConfigDetails{WorkingDir: "..", Environment: types.Mapping{},
		ConfigFiles: []types.ConfigFile{{Filename: composeFile}}}
	_, err = loader.LoadWithContext(context.Background(), details, func(o *loader.Options) { o.SetProjectName("outbox-inbox", true) })
	if err == nil || !strings.Contains(err.Error(), "make compose-env") {
		t.Errorf("without .env, compose must refuse to start and say how to make one; got %v", err)
	}

	p := loadProfiles(t, []string{"*"}, composeFile)
	env := func(svc, key string) string {
		if v := service(t, p, svc).Environment[key]; v != nil {
			return *v
		}
		return ""
	}
	if got := env("postgres", "POSTGRES_PASSWORD"); got != secrets["POSTGRES_PASSWORD"] {
		t.Errorf("postgres: POSTGRES_PASSWORD %q, want .env's", got)
	}
	for _, s := range p.Services {
		for k, v := range s.Environment {
			if v != nil && strings.Contains(k, "DATABASE_URL") && !strings.Contains(*v, ":"+secrets["POSTGRES_PASSWORD"]+"@") {
				t.Errorf("%s: %s does not carry .env's password: %s", s.Name, k, *v)
			}
		}
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s: port %d published on %q, want 127.0.0.1 only", s.Name, port.Target, port.HostIP)
			}
		}
	}
	for svc, want := range map[string][2]string{"orders": {"ORDERS_SIGNING_KEY", "INVENTORY_SIGNING_KEY"}, "inventory": {"INVENTORY_SIGNING_KEY", "ORDERS_SIGNING_KEY"}} {
		if env(svc, "SIGNING_KEY") != secrets[want[0]] || env(svc, "TRUSTED_KEYS") != secrets[want[1]] {
			t.Errorf("%s: SIGNING_KEY must be %s and TRUSTED_KEYS %s", svc, want[0], want[1])
		}
	}
	if env("demo", "ORDERS_SIGNING_KEY") != secrets["ORDERS_SIGNING_KEY"] {
		t.Error("demo: its replay is not signed with orders' key")
	}
	// Every server with state-changing routes listens beyond loopback in
	// its container, so each has a credential, and its clients send it.
	for svc, token := range map[string]string{"orders": "API_TOKEN", "inventory": "API_TOKEN", "provider": "PROVIDER_TOKEN", "demo": "API_TOKEN"} {
		if env(svc, "HTTP_TOKEN") != secrets[token] {
			t.Errorf("%s: HTTP_TOKEN is not .env's %s", svc, token)
		}
	}
	if env("orders", "PROVIDER_TOKEN") != secrets["PROVIDER_TOKEN"] {
		t.Error("orders: PROVIDER_TOKEN is not the provider's HTTP_TOKEN")
	}
	ignore, err := os.ReadFile("../.gitignore")
	if err != nil || !slices.Contains(strings.Fields(string(ignore)), "/.env") {
		t.Errorf(".gitignore does not keep .env out of git (%v)", err)
	}
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// TestComposeEnvironmentIsRead: every variable given to a service is one
// its binary reads (platform.EnvVars, the one list LoadConfig works from),
// and the required ones are all given.
func TestComposeEnvironmentIsRead(t *testing.T) {
	p := load(t, composeFile)
	known := platform.EnvVars()
	for _, name := range system.Services {
		s := service(t, p, name)
		for key := range s.Environment {
			if !slices.Contains(known, key) {
				t.Errorf("%s: environment variable %s is not read by the service (platform.EnvVars: %v)", name, key, known)
			}
		}
		for _, key := range []string{"DATABASE_URL", "KAFKA_BROKERS"} {
			if v := s.Environment[key]; v == nil || *v == "" {
				t.Errorf("%s: required variable %s not set", name, key)
			}
		}
		if v := s.Environment["DATABASE_URL"]; v != nil && !strings.HasSuffix(strings.SplitN(*v, "?", 2)[0], "/"+name) {
			t.Errorf("%s: DATABASE_URL %q is not the service's own database %q", name, *v, name)
		}
	}
}

var versioned = regexp.MustCompile(`\d`)

// pinned reports why image is not pinned to a version, or "".
func pinned(image string) string {
	if image == "scratch" { // the empty image: nothing to pull, nothing to pin
		return ""
	}
	if _, digest, ok := strings.Cut(image, "@sha256:"); ok && len(digest) == 64 {
		return ""
	}
	name := image
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	_, tag, ok := strings.Cut(name, ":")
	switch {
	case !ok:
		return "no tag (means latest)"
	case tag == "latest" || strings.HasPrefix(tag, "latest-"):
		return "tag latest"
	case !versioned.MatchString(tag):
		return fmt.Sprintf("tag %q names no version", tag)
	}
	return ""
}

// TestComposeImagesArePinned: every image a user's `docker compose up`
// pulls, directly or as a base image of a build, has a versioned tag, and
// the compose defaults are the Dockerfiles' own defaults.
func TestComposeImagesArePinned(t *testing.T) {
	p := loadProfiles(t, []string{"*"}, composeFile) // the observe profile's images too
	if _, err := p.GetService("grafana"); err != nil {
		t.Fatalf("the observe profile was not loaded: %v", err)
	}
	dockerfileArgs := map[string]map[string]string{}
	for _, s := range p.Services {
		if s.Build == nil {
			if why := pinned(s.Image); why != "" {
				t.Errorf("%s: image %q is not pinned: %s", s.Name, s.Image, why)
			}
			continue
		}
		df := filepath.Join(s.Build.Context, s.Build.Dockerfile)
		if dockerfileArgs[df] == nil {
			dockerfileArgs[df] = imageArgs(t, df)
		}
		for arg, def := range dockerfileArgs[df] {
			if why := pinned(def); why != "" {
				t.Errorf("%s: default of ARG %s is %q, not pinned: %s", df, arg, def, why)
			}
			v := s.Build.Args[arg]
			if v == nil {
				continue // the Dockerfile's default applies
			}
			if why := pinned(*v); why != "" {
				t.Errorf("%s: build arg %s=%q is not pinned: %s", s.Name, arg, *v, why)
			}
			if *v != def {
				t.Errorf("%s: build arg %s defaults to %q in compose but %q in %s", s.Name, arg, *v, def, df)
			}
		}
		if len(dockerfileArgs[df]) == 0 {
			t.Errorf("%s: found no *_IMAGE build arguments", df)
		}
	}
}

func TestPinned(t *testing.T) {
	for image, ok := range map[string]bool{
		"golang":               false,
		"postgres:latest":      false,
		"apache/kafka:latest":  false,
		"localhost:5000/kafka": false, // a port is no tag
		"gcr.io/distroless/static-debian12:nonroot": false,
		"postgres:15.18-bookworm":                   true,
		"apache/kafka:4.1.0":                        true,
		"localhost:5000/kafka:4.1.0":                true,
		"scratch":                                   true,
		"gcr.io/distroless/static-debian12@sha256:" + strings.Repeat("a", 64): true,
	} {
		if got := pinned(image) == ""; got != ok {
			t.Errorf("pinned(%q) = %q; want pinned %v", image, pinned(image), ok)
		}
	}
}

// imageArgs returns the `ARG *_IMAGE=default` lines of a Dockerfile.
func imageArgs(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && strings.EqualFold(fields[0], "ARG") {
			if name, def, ok := strings.Cut(fields[1], "="); ok && strings.HasSuffix(name, "_IMAGE") {
				args[name] = def
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return args
}

// TestComposeWiring: healthchecks probe the port each service listens on,
// the services start only after their infrastructure is healthy and the
// topics exist, and the topics are the system's, with its partitions.
func TestComposeWiring(t *testing.T) {
	p := load(t, composeFile)
	for _, name := range system.Services {
		s := service(t, p, name)
		_, port, err := net.SplitHostPort(*s.Environment["HTTP_ADDR"])
		if err != nil {
			t.Fatalf("%s: HTTP_ADDR: %v", name, err)
		}
		if s.HealthCheck == nil || !slices.Contains(s.HealthCheck.Test, "http://127.0.0.1:"+port+"/readyz") {
			t.Errorf("%s: healthcheck %v does not GET /readyz on port %s", name, s.HealthCheck, port)
		}
		_, console, err := net.SplitHostPort(*s.Environment["CONSOLE_ADDR"])
		if err != nil {
			t.Fatalf("%s: CONSOLE_ADDR: %v", name, err)
		}
		if len(s.Ports) != 2 || fmt.Sprint(s.Ports[0].Target) != port || fmt.Sprint(s.Ports[1].Target) != console {
			t.Errorf("%s: ports %+v do not publish container ports %s (its API) and %s (its console)", name, s.Ports, port, console)
		}
		for dep, cond := range map[string]string{"postgres": "service_healthy", "kafka-init": "service_completed_successfully"} {
			if got := s.DependsOn[dep].Condition; got != cond {
				t.Errorf("%s: depends_on %s condition %q, want %q", name, dep, got, cond)
			}
		}
	}
	demo := service(t, p, "demo")
	for _, dep := range system.Services {
		if got := demo.DependsOn[dep].Condition; got != "service_healthy" {
			t.Errorf("demo: depends_on %s condition %q, want service_healthy", dep, got)
		}
	}
	dash := service(t, p, "dashboard")
	for _, dep := range system.Services {
		if got := dash.DependsOn[dep].Condition; got != "service_healthy" {
			t.Errorf("dashboard: depends_on %s condition %q, want service_healthy (they create its tables)", dep, got)
		}
	}
	for _, v := range []string{"ORDERS_DATABASE_URL", "INVENTORY_DATABASE_URL"} {
		if d, w := dash.Environment[v], demo.Environment[v]; d == nil || w == nil || *d != *w {
			t.Errorf("dashboard: %s differs from the demo's", v)
		}
	}
	if dash.HealthCheck == nil || !slices.Contains(dash.HealthCheck.Test, "http://127.0.0.1:8090/healthz") ||
		*dash.Environment["DASHBOARD_ADDR"] != ":8090" {
		t.Errorf("dashboard: healthcheck %v does not GET /healthz on DASHBOARD_ADDR's port 8090", dash.HealthCheck)
	}
	for _, name := range []string{"postgres", "kafka"} {
		if s := service(t, p, name); s.HealthCheck == nil || len(s.HealthCheck.Test) == 0 {
			t.Errorf("%s has no healthcheck", name)
		}
	}
	initCmd := strings.Join(service(t, p, "kafka-init").Command, " ")
	for _, topic := range system.Topics {
		if !strings.Contains(initCmd, topic) {
			t.Errorf("kafka-init does not create topic %s", topic)
		}
	}
	if want := fmt.Sprintf("-partitions %d", stack.DefaultPartitions); !strings.Contains(initCmd, want) {
		t.Errorf("kafka-init does not create the topics with %s", want)
	}
}

// TestComposeCIRunsTheUsersFile: CI's compose run substitutes images, not
// settings: every docker-compose call in deploy/ci/compose-ci.sh names
// docker-compose.yml and no other file (the kfake override it once had is
// gone; Kafka in CI is the real broker, from a stand-in image), except the
// control run's, which must fail.
func TestComposeCIRunsTheUsersFile(t *testing.T) {
	b, err := os.ReadFile("../deploy/ci/compose-ci.sh")
	if err != nil {
		t.Fatal(err)
	}
	calls := regexp.MustCompile(`docker-compose [^\n]*`).FindAllString(string(b), -1)
	n := 0
	for _, c := range calls {
		files := regexp.MustCompile(`(?:-f|--file) ([\w./-]+)`).FindAllStringSubmatch(c, -1)
		control := strings.Contains(c, `-p "$PROJECT-control"`)
		for _, f := range files {
			// The control run alone adds deploy/ci/control.yml, under a
			// project of its own.
			if f[1] != "docker-compose.yml" && !(control && f[1] == "deploy/ci/control.yml") {
				t.Errorf("compose-ci runs another compose file: %s", c)
			}
		}
		if !control {
			n += len(files)
		}
	}
	if n < 2 {
		t.Fatalf("found %d docker-compose -f in compose-ci.sh: the check reads nothing", n)
	}
}
