package pgtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Plans collects the plan Postgres actually ran for every statement on the
// sessions of an Explained pool, with the rows each node produced: what a
// test needs to keep a statement's cost bounded as its tables grow,
// whatever the plan cache, the statistics and pgx's statement modes do. A
// prepared statement planned once while its table was empty keeps that
// plan (a hash join over a full scan, say) until the next ANALYZE; an
// EXPLAIN of the query text in the test would plan it afresh and see none
// of that.
type Plans struct {
	mu  sync.Mutex
	got []Plan
}

// Plan is one executed statement: its text and its plan, as auto_explain
// reports them (EXPLAIN ANALYZE, FORMAT JSON).
type Plan struct {
	Query string   `json:"Query Text"`
	Root  PlanNode `json:"Plan"`
}

// PlanNode is one node of a Plan.
type PlanNode struct {
	NodeType         string     `json:"Node Type"`
	Relation         string     `json:"Relation Name"`
	ActualRows       float64    `json:"Actual Rows"`
	ActualLoops      float64    `json:"Actual Loops"`
	RemovedByFilter  float64    `json:"Rows Removed by Filter"`
	RemovedByRecheck float64    `json:"Rows Removed by Index Recheck"`
	Plans            []PlanNode `json:"Plans"`
}

// RowsRead is how many rows of relation the plan's scans of it produced or
// filtered out, over all their loops: what the statement read of the table.
// A look-up by key reads a row per key; a scan reads what it passes. Rows
// an UPDATE or DELETE writes or returns are not counted (its ModifyTable
// node), nor dead tuples a scan steps over. A partitioned table's scans
// name its partitions: ask for those.
func (p Plan) RowsRead(relation string) int {
	var walk func(n PlanNode) float64
	walk = func(n PlanNode) float64 {
		var sum float64
		if n.Relation == relation && n.NodeType != "ModifyTable" {
			sum = (n.ActualRows + n.RemovedByFilter + n.RemovedByRecheck) * max(n.ActualLoops, 1)
		}
		for _, c := range n.Plans {
			sum += walk(c)
		}
		return sum
	}
	return int(walk(p.Root))
}

// Take returns the plans collected since the last Take and forgets them.
func (p *Plans) Take() []Plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	got := p.got
	p.got = nil
	return got
}

func (p *Plans) notice(_ *pgconn.PgConn, n *pgconn.Notice) {
	text, ok := strings.CutPrefix(n.Message, "duration: ")
	if !ok {
		return
	}
	i := strings.Index(text, "{")
	if i < 0 {
		return
	}
	var plan Plan
	if err := json.Unmarshal([]byte(text[i:]), &plan); err != nil {
		return
	}
	p.mu.Lock()
	p.got = append(p.got, plan)
	p.mu.Unlock()
}

// Explained returns a pool on pool's database whose sessions report the
// executed plan of every top-level statement they run (auto_explain, loaded
// per session: it needs a superuser, which the throwaway cluster's is), and
// the Plans they go to. It skips t only when Postgres refuses to load
// auto_explain (no right to, or no such module: an external DATABASE_URL);
// any other failure fails t. adjust may change the pool's config (MaxConns
// = 1: every statement on one session, so each is prepared and planned
// once); pool's own AfterConnect and OnNotice still run. The pool is closed
// when t ends.
func Explained(t testing.TB, pool *pgxpool.Pool, adjust ...func(*pgxpool.Config)) (*pgxpool.Pool, *Plans) {
	t.Helper()
	plans := &Plans{}
	cfg := pool.Config()
	for _, f := range adjust {
		f(cfg)
	}
	if onNotice := cfg.ConnConfig.OnNotice; onNotice != nil {
		cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) { onNotice(c, n); plans.notice(c, n) }
	} else {
		cfg.ConnConfig.OnNotice = plans.notice
	}
	afterConnect := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if afterConnect != nil {
			if err := afterConnect(ctx, conn); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, `LOAD 'auto_explain';
			SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
			SET auto_explain.log_timing = off; SET auto_explain.log_format = json;
			SET auto_explain.log_level = notice`)
		return err
	}
	explained, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err == nil {
		err = explained.Ping(context.Background())
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "58P01"): // insufficient_privilege, undefined_file
		t.Skipf("pgtest: Postgres refuses to load auto_explain here: %v", err)
	case err != nil:
		t.Fatalf("pgtest: a pool whose sessions explain their statements: %v", err)
	}
	t.Cleanup(explained.Close)
	return explained, plans
}

// Costly returns, a line per statement and table, the statements among
// plans that read more than limit rows of any of tables in a run, each with
// the most rows a run of it read: what a test of a statement's cost reports.
func Costly(plans []Plan, limit int, tables ...string) []string {
	most := map[string]string{}
	read := map[string]int{}
	for _, p := range plans {
		query := strings.Join(strings.Fields(p.Query), " ")
		for _, table := range tables {
			if n := p.RowsRead(table); n > limit && n > read[query+table] {
				read[query+table] = n
				most[query+table] = fmt.Sprintf("%d rows of %s: %s", n, table, query)
			}
		}
	}
	return slices.Sorted(maps.Values(most))
}
