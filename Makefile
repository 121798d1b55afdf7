# Run `make help` to list the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

GO       ?= go
ORDERS   ?= 1000
TEST_TIMEOUT ?= 25m

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the whole system (Postgres, embedded Kafka, orders, inventory, load) and check it: ORDERS=1000; STACK_KAFKA=apache for real Kafka
	$(GO) run ./cmd/demo -orders $(ORDERS)

.PHONY: live
live: ## The demo, kept running with the live page: the flow drawn, follow one order, "crash it now" (Ctrl-C stops it)
	$(GO) run ./cmd/demo -orders 200 -keep -trickle 2

.PHONY: test
test: vet ## Unit and integration tests, with -race, on the self-starting stack; then the crash windows' own tests in a failpoint build
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./... ./pkg/...
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -tags failpoint -run 'Failpoint|Hit|Configure|Trace|FromEnv|CrashRoute|WithoutDedupe|Controls' ./pkg/failpoint/ ./pkg/inbox/ ./pkg/inbox/inboxtest/ ./services/internal/platform/

LOOPS ?= 5

.PHONY: test-loop
test-loop: ## make test LOOPS times (5) back to back beside a CPU-heavy process, each run's verdict: test-loop.txt
	@deploy/ci/test-loop.sh $(LOOPS) | tee test-loop.txt

.PHONY: vet
vet: ## go vet and a gofmt check
	$(GO) vet ./... ./pkg/...
	$(GO) vet -tags failpoint ./... ./pkg/...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi

.PHONY: model
model: ## The protocol's Promela model in Spin (apt-get install spin): every property holds at the bounds docs/model.md states, every control fails with its counterexample (chaos/model/check.sh)
	chaos/model/check.sh

.PHONY: build
build: ## Build the service binaries into bin/
	CGO_ENABLED=0 $(GO) build -o bin/ ./services/orders ./services/inventory

SEED ?= 7
# FRESH_SEED: a schedule no earlier run used, drawn once per make (chaos-ci
# proves the apache profile on it, chaos-apache beside SEED; chaos-seeds
# draws one per run).
ifndef FRESH_SEED
FRESH_SEED := $(shell od -An -N4 -tu4 /dev/urandom | awk '{print $$1 % 1000000}')
endif

# trace-ok REPORT: the run's failpoint trace is a behaviour of the protocol's
# model, every kill inside its window (chaos/judge/trace.go, chaos/model/trace): a
# control must fail for its own reason, its trace in the model like any run's.
define trace-ok
	@grep -Eq '"trace-in-model": true' $(1) || { echo "FAIL: $(1): the run's failpoint trace is not a behaviour of the model (see \"trace\" in it)"; exit 1; }
endef

# chaos-proof PROFILE [ORDERS]: the profile must pass on SEED and on
# FRESH_SEED (chaos-two-seeds), and the same run with the inbox and the
# services' domain guard off (the second control) must fail (chaos-double).
define chaos-proof
	$(call chaos-two-seeds,$(1))
	$(call chaos-double,$(1),$(2))
endef

# chaos-two-seeds PROFILE: the profile must pass on SEED and on FRESH_SEED.
define chaos-two-seeds
	./bin/chaos -profile $(1) -seed $(SEED) -report chaos-report-$(1).json
	$(call chaos-fresh-seed,$(1))
endef

# chaos-fresh-seed PROFILE: the profile must pass on FRESH_SEED.
define chaos-fresh-seed
	@echo "== $(1) on the fresh seed $(FRESH_SEED) =="
	@./bin/chaos -profile $(1) -seed $(FRESH_SEED) -report chaos-report-$(1)-fresh.json || { \
		echo "FAIL: the $(1) profile failed on the fresh seed $(FRESH_SEED) (replay: go run ./chaos -profile $(1) -seed $(FRESH_SEED))"; exit 1; }
endef

# chaos-double PROFILE [ORDERS]: the second control, the inbox and the
# services' domain guard off, must fail with double-applies and not for
# another reason: double-applies of the crash windows' own messages (it
# sends no hostile ones), every copy that met an effect committed before its
# kill applied twice (the floor, see chaos/judge/attribution.go). ORDERS,
# when given, shortens the run: it needs double-applies, not the profile's
# reach.
define chaos-double
	@echo "== control run 2 ($(1)): inbox and domain guard off; the checker must catch double-applies =="
	@if ./bin/chaos -profile $(1) $(if $(2),-orders $(2)) -seed $(SEED) -inbox=off -guard=off -report chaos-control-$(1).json; then \
		echo "FAIL: the $(1) control run 2 passed, so the checker cannot see double-applies"; exit 1; fi
	@grep -Eq '"crash_window_double_applied": [1-9]' chaos-control-$(1).json || { echo "FAIL: the $(1) control run 2 failed, but not with double-applies of the crash windows' own messages"; exit 1; }
	@grep -Eq '"exactly-once": false' chaos-control-$(1).json || { echo "FAIL: the $(1) control run 2 failed, but exactly-once held: the checker did not see the double-applies"; exit 1; }
	@grep -Eq '"attribution": true' chaos-control-$(1).json || { echo "FAIL: the $(1) control run 2: a copy the crash windows made was not applied twice, or none came back (see attribution)"; exit 1; }
	@grep -Eq '"audit-alarms": false' chaos-control-$(1).json || { echo "FAIL: the $(1) control run 2: the auditor beside it raised no alarm for the double-applies (see audit-alarms)"; exit 1; }
	$(call trace-ok,chaos-control-$(1).json)
	@echo "control run 2 ($(1)) failed with the crash windows' double-applies, each copy that met a committed effect applied twice, as it must"
endef

# chaos-guard PROFILE [ORDERS]: the first control, the inbox off: the run
# must pass on the domain guard alone, which must have refused redeliveries
# (the "layers" invariant counts them).
define chaos-guard
	@echo "== control run 1 ($(1)): the inbox switched off; the domain guard must refuse every redelivery =="
	./bin/chaos -profile $(1) $(if $(2),-orders $(2)) -seed $(SEED) -inbox=off -report chaos-control-inbox-off-$(1).json
	@grep -Eq '"refused_not_hostile": [1-9]' chaos-control-inbox-off-$(1).json || { echo "FAIL: the $(1) control run 1 had no redelivery reach the guard"; exit 1; }
	@grep -Eq '"attribution": true' chaos-control-inbox-off-$(1).json || { echo "FAIL: the $(1) control run 1: a crash window's copy was not refused by the guard (see attribution)"; exit 1; }
endef

# chaos-effects PROFILE ORDERS: the effect control: payment captures sent
# without their idempotency key must fail the provider's ledger check
# (payments-once) with double captures, and the after-effect-before-record
# kills must account for some of them: each such capture called again was
# captured twice (chaos/judge/effects.go).
define chaos-effects
	@echo "== effect control ($(1)): captures without their idempotency key; the ledger check must catch double captures =="
	@if ./bin/chaos -profile $(1) -orders $(2) -seed $(SEED) -effect-keys=off -report chaos-control-effects-$(1).json; then \
		echo "FAIL: the $(1) effect control passed, so the ledger check cannot see double captures"; exit 1; fi
	@grep -Eq '"payments-once": false' chaos-control-effects-$(1).json || { echo "FAIL: the $(1) effect control failed, but not on the provider's ledger"; exit 1; }
	@grep -Eq '"effect_window_double_captures": [1-9]' chaos-control-effects-$(1).json || { echo "FAIL: the $(1) effect control: no double capture came from after-effect-before-record"; exit 1; }
	@grep -Eq '"effect_attribution": true' chaos-control-effects-$(1).json || { echo "FAIL: the $(1) effect control: a capture called again after the provider made it was not captured twice (see attribution)"; exit 1; }
	$(call trace-ok,chaos-control-effects-$(1).json)
	@echo "effect control ($(1)) failed with double captures, those after-effect-before-record called again each captured twice, as it must"
endef

# chaos-order: the ordering control. The relays publish in parallel
# (RELAY_PARALLEL, small batches, no shards), so replicas claim interleaved
# runs of the outbox and a probe key's messages overtake each other: the run
# must fail on ordered-per-key (the inbox still suppresses every repeat, so
# no other invariant may fail), with first copies out of order across
# transactions, not only within one, and nothing split, lost or invented.
# The smoke profile with 2,000 orders: under a minute, long enough for its
# crash windows to reach both consumers, though not always every one of
# orders' nine at its minimum of one (CI at 18b3f02: after-effect-before-
# record 0), so faults-bit, which judges the run's reach and not what the
# system did, may fail beside it.
define chaos-order
	@echo "== control run 3 (smoke): relays in parallel; the checker must catch keys out of order =="
	@if ./bin/chaos -profile smoke -orders 2000 -seed $(SEED) -relay=parallel -report chaos-control-parallel.json; then \
		echo "FAIL: control run 3 passed, so the checker cannot see a key's messages out of order"; exit 1; fi
	@grep -Eq '"failed": "(faults-bit,)?ordered-per-key"' chaos-control-parallel.json || { echo "FAIL: control run 3 failed, but not on ordered-per-key alone (see \"failed\" in chaos-control-parallel.json)"; exit 1; }
	@grep -Eq '"reordered_across_transactions": [1-9]' chaos-control-parallel.json || { echo "FAIL: control run 3 failed ordered-per-key, but with no first copy out of order across transactions"; exit 1; }
	@if grep -Eq '"(split|lost|phantom)": [1-9]' chaos-control-parallel.json; then echo "FAIL: control run 3 found keys split, lost or phantom messages: parallel relays only reorder"; exit 1; fi
	$(call trace-ok,chaos-control-parallel.json)
	@echo "control run 3 failed on ordered-per-key alone, with first copies out of order across transactions and nothing split, lost or invented, as it must"
endef

.PHONY: chaos-ci
chaos-ci: ## The chaos proof CI runs: apache (real Kafka, 3 brokers) must pass on a fresh seed (FRESH_SEED, printed first; SEED=7 on real Kafka is the failover profile's, and make chaos-apache's); ci (kfake) with inbox and guard off (4,000 orders) must fail; ci with the inbox alone off must pass on the guard; smoke with parallel relays must fail ordered-per-key; apache with effect keys off must fail with double captures
	@echo "chaos-ci: seeds $(SEED) (fixed) and $(FRESH_SEED) (fresh; replay a failure with FRESH_SEED=$(FRESH_SEED))"
	$(GO) build -o bin/chaos ./chaos
	$(call chaos-double,ci,4000)
	$(call chaos-guard,ci)
	$(call chaos-order)
	$(call chaos-fresh-seed,apache)
	$(call chaos-effects,apache,3000)

.PHONY: chaos-apache
chaos-apache: ## The chaos proof on real Apache Kafka alone (3 JVM brokers, broker and network faults) on SEED=7 and FRESH_SEED, and its control run with inbox and guard off
	$(GO) build -o bin/chaos ./chaos
	$(call chaos-proof,apache)

# chaos-failover: the proof on a replicated Postgres, and its control. On
# synchronous replication (Patroni, strict) the primary killed, cut off and
# switched over during the load must pass every invariant; on asynchronous
# replication with the primary's last commits never sent, the failover
# loses them, and the run must fail on no-ghost-events and
# committed-applied, the two invariants a failover can break, and on
# continuity-alarms (the consumers see their producers go back); the same
# asynchronous run with DATABASE_STANDBYS=1 (pkg/standby) must pass.
define chaos-failover
	@echo "== failover: real Kafka on three Postgres nodes under Patroni (synchronous, strict), the primary failed over 6 times: must PASS =="
	./bin/chaos -profile failover -seed $(SEED) -report chaos-report-failover.json
	$(call trace-ok,chaos-report-failover.json)
	@echo "== failover control: asynchronous replication, the primary's last commits never sent; the checker must catch ghosts and lost messages =="
	@if ./bin/chaos -profile failover-async -orders $(1) -seed $(SEED) -report chaos-control-failover-async.json; then \
		echo "FAIL: the failover control passed, so the checker cannot see what a lossy failover does"; exit 1; fi
	@grep -Eq '"no-ghost-events": false' chaos-control-failover-async.json || { echo "FAIL: the failover control failed, but found no ghost event (see no-ghost-events)"; exit 1; }
	@grep -Eq '"committed-applied": false' chaos-control-failover-async.json || { echo "FAIL: the failover control failed, but found no committed message unapplied (see committed-applied)"; exit 1; }
	@grep -Eq '"continuity-alarms": false' chaos-control-failover-async.json || { echo "FAIL: the failover control failed, but no consumer saw its producer's history go back (see continuity-alarms)"; exit 1; }
	@grep -Eq '"audit-alarms": false' chaos-control-failover-async.json || { echo "FAIL: the failover control failed, but the auditor raised no alarm for what the failover lost (see audit-alarms)"; exit 1; }
	@echo "the failover control failed with ghost events, committed messages never applied, the consumers' continuity alarms and the auditor's, as it must"
	@echo "== failover on asynchronous replication, what leaves a transaction waiting for a standby (DATABASE_STANDBYS=1, pkg/standby): must PASS =="
	./bin/chaos -profile failover-async -orders $(1) -standbys 1 -seed $(SEED) -report chaos-report-failover-standbys.json
	$(call trace-ok,chaos-report-failover-standbys.json)
endef

.PHONY: failover
failover: ## The proof on a replicated Postgres (Patroni, etcd and Debian's postgresql-15 installed): its tests (a failover keeps every acknowledged commit), the failover profile on synchronous replication must pass, its asynchronous control must fail with ghosts, lost messages and the consumers' continuity alarms, and asynchronous replication with DATABASE_STANDBYS=1 must pass (docs/failover.md)
	REQUIRE_PATRONI=1 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run 'Patroni' ./chaos/stack/
	$(GO) build -o bin/chaos ./chaos
	$(call chaos-failover,2000)

.PHONY: e2e-apache
e2e-apache: ## The end-to-end tests on real Apache Kafka (STACK_KAFKA=apache) instead of the embedded broker
	STACK_KAFKA=apache $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./chaos/e2e/

RUNS ?= 5

.PHONY: chaos-seeds
chaos-seeds: ## The apache profile RUNS times (5), each on a fresh seed, and each seed's verdict: chaos-seeds.txt
	$(GO) build -o bin/chaos ./chaos
	@chaos/seeds.sh apache $(RUNS) | tee chaos-seeds.txt

.PHONY: chaos
chaos: ## The long chaos profile: SEED=7
	$(GO) run ./chaos -profile long -seed $(SEED) -report chaos-report.json

.PHONY: bench
bench: ## Benchmark textbook vs project vs the database's limit, in one run: bench-report.json + .svg; then the relay alone vs Watermill's Forwarder (bench-relay-report.json); then PublishTx with and without its per-key lock
	$(GO) run ./bench
	$(GO) run ./bench -relay
	$(GO) test -run '^$$' -bench 'PublishTx' -count 3 ./pkg/outbox/ | tee bench-publishtx.txt

.PHONY: bench-history
bench-history: ## The cost as the tables grow: the project build on empty tables beside the same on 10 million rows of history per table (kfake, 2 rounds, the hop timed at 250 orders/s; about 25 minutes): bench-history.json
	BENCH_REPORT=$${BENCH_REPORT:-bench-history.json} $(GO) run ./bench -only project,project_history -history 10000000 -rounds 2 -rate 250 -kafka kfake

.PHONY: bench-replicated
bench-replicated: ## What replication costs the order round trip: one Postgres node beside three under Patroni, asynchronous, synchronous (strict) and asynchronous with DATABASE_STANDBYS=1 (Patroni and etcd as for make failover; kfake, 5 rounds, the hop timed at 100 orders/s; about 13 minutes): bench-replicated-report.json
	BENCH_REPLICATED_REPORT=$${BENCH_REPLICATED_REPORT:-bench-replicated-report.json} $(GO) run ./bench -replicated -rounds 5 -rate 100 -orders 10000

.PHONY: bench-faults
bench-faults: ## Throughput under faults: the relay at 500 rows/s on a 3-node Apache Kafka cluster, quiet, then a broker SIGKILLed, then a leader change, then quiet again (3 rounds, about 6 minutes): bench-faults-report.json
	BENCH_FAULTS_REPORT=$${BENCH_FAULTS_REPORT:-bench-faults-report.json} $(GO) run ./bench -faults -rounds 3

.PHONY: bench-soak
bench-soak: ## Retention under a steady load: an inbox and an outbox deleting rows beside a pair dropping partitions, 200 messages/s each for 20 minutes, a transaction held open in the middle third: bench-soak-report.json
	BENCH_SOAK_REPORT=$${BENCH_SOAK_REPORT:-bench-soak-report.json} $(GO) run ./bench -soak 20m -rate 200

.PHONY: bench-smoke
bench-smoke: ## A few seconds of the benchmark, to keep it working (CI runs this)
	BENCH_REPORT=$${BENCH_REPORT:-/tmp/bench-smoke.json} $(GO) run ./bench -smoke
	BENCH_RELAY_REPORT=$${BENCH_RELAY_REPORT:-/tmp/bench-relay-smoke.json} $(GO) run ./bench -relay -smoke
	BENCH_FAULTS_REPORT=$${BENCH_FAULTS_REPORT:-/tmp/bench-faults-smoke.json} $(GO) run ./bench -faults -smoke
	BENCH_SOAK_REPORT=$${BENCH_SOAK_REPORT:-/tmp/bench-soak-smoke.json} $(GO) run ./bench -soak 15s -smoke -rate 100

.PHONY: compose-env
compose-env: ## Once, before docker compose up: write .env with this machine's secrets (passwords, signing keys, tokens), or add what an existing one lacks; never committed
	$(GO) run ./deploy/composeenv

.PHONY: compose-ci
compose-ci: ## docker-compose.yml for real on this Docker engine (stand-ins of the official images, real Apache Kafka): demo must pass, down -v leaves nothing
	deploy/ci/compose-ci.sh
