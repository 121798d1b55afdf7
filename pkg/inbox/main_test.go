package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// The servers every test of the package shares: started once by TestMain.
// Each test gets its own database on pg, and its own topic and consumer group
// on kfk.
var (
	pg  *pgtest.Server
	kfk *kafkatest.Broker
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if pg, err = pgtest.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "inbox tests:", err)
		return 1
	}
	defer pg.Stop() //nolint:errcheck // best effort; the temp dir is reaped by the next run otherwise
	if kfk, err = kafkatest.Start(ctx, kafkatest.Options{Partitions: 3}); err != nil {
		fmt.Fprintln(os.Stderr, "inbox tests:", err)
		return 1
	}
	defer kfk.Close()
	// The examples find their database and broker the way a reader's program
	// would, in DATABASE_URL and KAFKA_BROKERS: one database for them all
	// (each example keeps to tables, consumers and topics of its own). Set
	// only now: pgtest.Start and kafkatest.Start read the same variables.
	name := fmt.Sprintf("inbox_examples_%d", os.Getpid())
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inbox tests:", err)
		return 1
	}
	pg.DropAtStop(name)
	if err := errors.Join(os.Setenv("DATABASE_URL", url), os.Setenv("KAFKA_BROKERS", strings.Join(kfk.Brokers(), ","))); err != nil {
		fmt.Fprintln(os.Stderr, "inbox tests:", err)
		return 1
	}
	return m.Run()
}

var dbSeq atomic.Int64

// createDatabase creates an empty database with a name unique to this process
// and returns its URL. The pid keeps concurrent runs against one DATABASE_URL
// apart.
func createDatabase(ctx context.Context) (name, url string, err error) {
	name = fmt.Sprintf("inbox_test_%d_%d", os.Getpid(), dbSeq.Add(1))
	url, err = pg.CreateDatabase(ctx, name)
	return name, url, err
}

// domainSchema is the test handler's domain table. It has no unique
// constraint on purpose, so that a message applied twice shows up as two rows.
const domainSchema = `CREATE TABLE applied (consumer text NOT NULL, message_id text NOT NULL, n int NOT NULL)`

// newTestDB returns a pool on a fresh database holding the inbox, the outbox
// (dead letters go through it) and the domain table. The pool is closed when
// the test ends.
func newTestDB(t testing.TB, ctx context.Context) *pgxpool.Pool {
	t.Helper()
	name, url, err := createDatabase(ctx)
	require.NoError(t, err)
	t.Logf("database %s", name)
	pg.DropWhenDone(t, name)

	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 16 // ten concurrent deliveries plus the test's own queries
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	require.NoError(t, inbox.Migrate(ctx, pool))
	require.NoError(t, outbox.Migrate(ctx, pool))
	_, err = pool.Exec(ctx, domainSchema)
	require.NoError(t, err)
	return pool
}
