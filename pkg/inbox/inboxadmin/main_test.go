package inboxadmin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// TestMain starts the Postgres and the broker the examples find, as a
// reader's program would, in DATABASE_URL and KAFKA_BROKERS. The operator's
// side is tested with the runtime beside it, in package inbox's tests (a
// redrive is proved by the consumer applying it): here are its examples.
func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxadmin tests:", err)
		return 1
	}
	defer pg.Stop() //nolint:errcheck // best effort; the temp dir is reaped by the next run otherwise
	kfk, err := kafkatest.Start(ctx, kafkatest.Options{Partitions: 3})
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxadmin tests:", err)
		return 1
	}
	defer kfk.Close()
	name := fmt.Sprintf("inboxadmin_examples_%d", os.Getpid())
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxadmin tests:", err)
		return 1
	}
	pg.DropAtStop(name)
	if err := errors.Join(os.Setenv("DATABASE_URL", url), os.Setenv("KAFKA_BROKERS", strings.Join(kfk.Brokers(), ","))); err != nil {
		fmt.Fprintln(os.Stderr, "inboxadmin tests:", err)
		return 1
	}
	return m.Run()
}
