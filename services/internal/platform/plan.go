package platform

import "github.com/jackc/pgx/v5"

// PlanEachTime, passed before a statement's arguments, has Postgres plan the
// statement for its tables as they are at that call (pgx's unnamed
// statement, the same single round trip). The services pass it to every
// statement that finds rows by key (= ANY, a join with unnest, a primary
// key) of a table that grows, with the orders or with the catalogue, and
// to the outbox backlog's metric.
//
// Without it, pgx prepares the statement, and from its sixth run Postgres
// may keep one generic plan for it (a statement without parameters, from
// its first). A plan made while the table was small, as every new
// deployment's is for its first minute (autovacuum's first ANALYZE comes
// at 50 rows, the next up to a minute later), reads the whole table: a
// full scan is cheaper than an index on 60 rows, and the plan is kept as
// the table grows to tens of thousands, until the next ANALYZE. Planned per
// call, a statement still sees the statistics of those few rows, so the
// joins with unnest also name their keys with = ANY: a look-up per key
// whatever the statistics say (docs/library.md). Planning every statement
// afresh instead (plan_cache_mode = force_custom_plan) cost 15% of the
// throughput in docs/benchmark.md's pair ("Plans made while a table was
// small"); these few statements cost nothing measurable there. Each
// service's TestStatementsStayCheapAsTheTablesGrow checks the rows they read.
const PlanEachTime = pgx.QueryExecModeExec
