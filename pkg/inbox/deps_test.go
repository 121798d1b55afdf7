package inbox_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// leanModules are the only modules a program importing pkg/inbox and
// pkg/outbox links besides the standard library: Watermill's core, pgx,
// uuid, the OpenTelemetry API, and what they bring. Sarama and
// watermill-kafka are in inboxkafka and outboxkafka only; the reference
// system's tooling (chromedp, compose-go, kfake, internal/...) never. A new
// dependency fails this test until it is added here on purpose.
var leanModules = []string{
	"github.com/outboxref/outbox-inbox/pkg",
	"github.com/ThreeDotsLabs/watermill",
	"github.com/jackc", "golang.org/x/sync", "golang.org/x/text", // pgx
	"github.com/google/uuid",
	"github.com/lithammer/shortuuid", "github.com/oklog/ulid", "github.com/pkg/errors", // Watermill
	"go.opentelemetry.io/otel", "go.opentelemetry.io/auto/sdk", "github.com/go-logr", "github.com/cespare/xxhash",
}

func TestLibraryDependenciesAreLean(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".", "../outbox")
	cmd.Env = append(os.Environ(), "GOWORK=off") // the library's module alone, as an importer gets it
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 5 {
		t.Fatalf("go list listed %d packages, want the library's and its dependencies': %q", len(deps), deps)
	}
	for _, dep := range deps {
		allowed := false
		for _, m := range leanModules {
			allowed = allowed || dep == m || strings.HasPrefix(dep, m+"/")
		}
		if !allowed {
			t.Errorf("pkg/inbox or pkg/outbox links %s: not a lean dependency (see leanModules)", dep)
		}
	}
}
