#!/usr/bin/env bash
# make compose-ci: runs docker-compose.yml for real on this machine's Docker
# engine, as a user's `docker compose up` would, and judges the result.
#
# What is substituted, and only because this machine has no container
# registry (nothing can be pulled):
#   - the base images: GO_IMAGE, POSTGRES_IMAGE and KAFKA_IMAGE point at
#     local stand-ins (deploy/ci/standins.sh: debootstrapped Debian + the
#     host's Go / Debian's postgresql-15 / Debian's JRE 17 with Apache
#     Kafka's own jars from Maven Central, configured from the compose
#     file's KAFKA_* as the apache/kafka image configures itself), built
#     once and cached.
# Everything else is the user's: the compose file as it is (no override),
# real Apache Kafka included; services/Dockerfile (multi-stage, static,
# scratch, non-root), docker-compose.yml's healthchecks, depends_on
# conditions, network, environment, the init script, the migrations the
# services apply at start, and the demo container.
#
# Steps: stand-ins → docker build → `up --exit-code-from demo demo` → checks
# of the demo's output, the services' logs, the images and, with psql, the
# databases → `down -v` → nothing of the project left. Logs and timings go
# to .tmp/compose-ci/. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"

PROJECT=${COMPOSE_PROJECT_NAME:-outbox-ci}
OUT=${COMPOSE_CI_OUT:-$PWD/.tmp/compose-ci}
TIMEOUT=${COMPOSE_CI_TIMEOUT:-900} # seconds for `up` (services start + demo)
export DEMO_ORDERS=${DEMO_ORDERS:-300}

say() { echo "compose-ci: $*"; }
fail() {
	say "FAIL: $*"
	exit 1
}
START=$SECONDS
t0=$SECONDS
TIMES=()
mark() {
	TIMES+=("$(printf '  %-34s %4ds' "$1" $((SECONDS - t0)))")
	t0=$SECONDS
}

rm -rf "$OUT"
mkdir -p "$OUT"

command -v docker >/dev/null || fail "docker is not installed"
docker info >/dev/null 2>&1 || fail "the Docker daemon is not running"
if ! command -v docker-compose >/dev/null; then
	say "docker-compose missing; installing Debian's"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
say "$(docker-compose version --short 2>/dev/null || docker-compose version | head -1), engine $(docker version -f '{{.Server.Version}}')"

# One run at a time on this engine: two runs would share the project's
# name, its network and volume, the stand-ins' tags and the host ports.
LOCK=/var/tmp/outbox-compose-ci.lock
exec 9>"$LOCK"
if ! flock -n 9; then
	say "another compose-ci run holds $LOCK; waiting for it (at most 30 min)"
	flock -w 1800 9 || fail "another compose-ci run still holds $LOCK"
fi

# Build and run from a snapshot of the tree: what is built is what is
# judged, even if files change meanwhile.
SNAP=$(mktemp -d /var/tmp/outbox-compose-ci.XXXXXX)
tar --exclude=./.git --exclude=./.tmp --exclude=./bin -c . | tar -x -C "$SNAP"

# The secrets, as a user's `make compose-env` writes them to .env: new ones
# for this run, outside the snapshot, handed to every docker-compose call.
ENV_FILE="$OUT/compose.env"
(cd "$SNAP" && go run ./deploy/composeenv -o "$ENV_FILE" -force) >/dev/null || fail "writing the secrets (deploy/composeenv)"

compose() { (cd "$SNAP" && docker-compose --env-file "$ENV_FILE" -p "$PROJECT" -f docker-compose.yml "$@"); }

finish() {
	local rc=$?
	set +e
	if [ -n "${CONTROL_STARTED:-}" ]; then
		control down -v --remove-orphans --timeout 20 >>"$OUT/down.log" 2>&1
	fi
	if [ -n "${STARTED:-}" ]; then
		compose logs --no-color --timestamps >"$OUT/compose.log" 2>&1
		compose down -v --remove-orphans --timeout 20 >"$OUT/down.log" 2>&1
		local left
		left=$(
			docker ps -aq --filter "label=com.docker.compose.project=$PROJECT"
			docker network ls -q --filter "label=com.docker.compose.project=$PROJECT"
			docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT"
		)
		if [ -n "$left" ]; then
			say "FAIL: left behind after down -v:"
			docker ps -a --filter "label=com.docker.compose.project=$PROJECT"
			rc=1
		else
			say "down -v: no container, network or volume of project $PROJECT left"
		fi
	fi
	rm -rf "$SNAP"
	if [ "$rc" != 0 ]; then
		say "FAILED (exit $rc); logs in $OUT"
		[ -s "$OUT/compose.log" ] && tail -60 "$OUT/compose.log"
	fi
	exit "$rc"
}
trap finish EXIT

# 1. Stand-ins of the official images.
standins=$("$SNAP/deploy/ci/standins.sh") || fail "building the stand-in images (deploy/ci/standins.sh)"
eval "$standins"
export GO_IMAGE POSTGRES_IMAGE KAFKA_IMAGE PROMETHEUS_IMAGE
mark "stand-in images"

# 2. Build. The services' build stage first, under a tag: compose's builds
# of orders, inventory and demo take it from the cache, and the images of
# earlier builds can be told apart and removed.
STARTED=1
compose down -v --remove-orphans >/dev/null 2>&1 || true # an aborted run's leftovers
images() { # the project's own images: the build stage and what compose built
	docker image inspect -f '{{.Id}}' outbox-ci/build-stage:latest 2>/dev/null || true
	docker images -q --no-trunc --filter "reference=${PROJECT}_*" --filter "reference=${PROJECT}-*"
}
before=$(images)
(
	cd "$SNAP"
	docker build -f services/Dockerfile --target build --build-arg "GO_IMAGE=$GO_IMAGE" \
		-t outbox-ci/build-stage:latest .
) >"$OUT/build.log" 2>&1 || {
	tail -40 "$OUT/build.log"
	fail "docker build of the services' build stage"
}
compose build >>"$OUT/build.log" 2>&1 || {
	tail -40 "$OUT/build.log"
	fail "docker-compose build"
}
# Images of earlier builds that the tags have moved away from.
for id in $before; do
	if [ "$(docker image inspect -f '{{len .RepoTags}}' "$id" 2>/dev/null)" = 0 ]; then
		docker rmi "$id" >/dev/null 2>&1 || true
	fi
done
mark "docker build"

# 3. Up: the demo and everything it depends on, in dependency order, each
# waiting for its dependencies' healthchecks; the run ends when the demo
# exits, with its exit code.
say "docker-compose up --exit-code-from demo demo dashboard auditor (DEMO_ORDERS=$DEMO_ORDERS)"
set +e
(
	cd "$SNAP"
	timeout -k 20 "$TIMEOUT" docker-compose --env-file "$ENV_FILE" -p "$PROJECT" -f docker-compose.yml \
		up --no-build --no-color --abort-on-container-exit --exit-code-from demo demo dashboard auditor
) 2>&1 | tee "$OUT/up.log"
up_rc=${PIPESTATUS[0]}
set -e
mark "up (services start + demo)"
compose logs --no-color >"$OUT/compose.log" 2>&1 || true
[ "$up_rc" = 0 ] || fail "the demo exited $up_rc (124: timed out after ${TIMEOUT}s)"

# 4. Checks.
sed -nE 's/^demo[-_]1 +\| ?//p' "$OUT/compose.log" >"$OUT/demo.log"
svc_log() { sed -nE "s/^$1[-_]1 +\\| ?//p" "$OUT/compose.log"; }
h='…[0-9a-f]{8}'
expect() { # expect DESCRIPTION REGEX: a line of the demo's output matches
	grep -Eq "$2" "$OUT/demo.log" || fail "the demo did not print $1 (no line matching: $2)"
	say "ok: $1: $(grep -Em1 "$2" "$OUT/demo.log")"
}
expect "the replayed order's flow" "^order $h paid → OrderPaid $h published → inventory reserved [0-9]+ × sku-[0-9]+ → duplicate delivery of $h suppressed → order $h reserved$"
expect "the double-submitted order's flow (one OrderPaid)" "^order $h paid twice at once → OrderPaid $h published → inventory reserved [^→]+ → order $h reserved$"
expect "the rejected order's flow" "^order $h paid → OrderPaid $h published → inventory rejected it \(insufficient stock: [^)]+\) → order $h rejected$"
expect "the exactly-once invariant" "^  PASS  exactly-once "
expect "the stock invariant" "^  PASS  stock-consistent "
expect "the nothing-lost invariant" "^  PASS  nothing-lost "
expect "the per-run check" "^every paid order ended reserved or rejected: $((DEMO_ORDERS + 3)) paid in this run"
expect "PASS" "^PASS$"

replayed=$(sed -nE 's/^replayed OrderPaid ([0-9a-f-]{36}) .*/\1/p' "$OUT/demo.log")
[ -n "$replayed" ] || fail "the demo did not say which OrderPaid it replayed"
svc_log inventory | grep -c "duplicate delivery suppressed.*message_id=$replayed" >/dev/null ||
	fail "inventory's log does not show the replayed $replayed suppressed"
say "ok: inventory logged the replayed $replayed as a suppressed duplicate"
for s in orders inventory; do
	svc_log "$s" | grep -c 'msg=started' >/dev/null || fail "$s never logged that it started"
	svc_log "$s" | grep -c "principal=User:$s" >/dev/null || fail "$s was not configured to log in to Kafka as its principal $s"
done
# Kafka asks for logins: kafka-init made a principal per client.
for s in orders inventory demo dashboard; do
	svc_log kafka-init | grep -c "^principal $s: logs in" >/dev/null || fail "kafka-init did not make the principal $s"
done
say "ok: kafka-init made the principals orders, inventory, demo and dashboard; orders and inventory log in as theirs (and are healthy: consuming)"

# The images as users get them: static binary on scratch, non-root, small,
# no shell.
for s in orders inventory auditor demo dashboard kafka-init; do
	cid=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$s" | head -1)
	img=$(docker inspect -f '{{.Image}}' "$cid")
	user=$(docker image inspect -f '{{.Config.User}}' "$img")
	size=$(docker image inspect -f '{{.Size}}' "$img")
	[ "$user" = 65532:65532 ] || fail "$s image runs as '$user', not 65532:65532"
	[ "$size" -lt $((60 * 1024 * 1024)) ] || fail "$s image is $((size / 1024 / 1024)) MB"
	if docker run --rm --entrypoint /bin/sh "$img" -c true >/dev/null 2>&1; then
		fail "$s image has a shell: it is not the scratch image"
	fi
	say "ok: $s image: user $user, $((size / 1024 / 1024)) MB, no shell"
done

# The databases, read independently of the demo.
compose start postgres >/dev/null 2>&1
for _ in $(seq 1 60); do
	compose exec -T postgres pg_isready -h 127.0.0.1 -U postgres >/dev/null 2>&1 && break
	sleep 1
done
# psql inside the postgres container, with the password .env gave it.
psql_in() { compose exec -T postgres sh -c 'PGPASSWORD="$POSTGRES_PASSWORD" psql -h 127.0.0.1 -U postgres -d "$0" -tAc "$1"' "$1" "$2"; }
psql_orders() { psql_in orders "$1"; }
counts=$(psql_orders "SELECT count(*) FILTER (WHERE status IN ('reserved', 'rejected')) || ' ' || count(*) FILTER (WHERE status = 'paid') FROM orders")
read -r settled unsettled <<<"$counts"
[ "$unsettled" = 0 ] || fail "psql: $unsettled paid orders are neither reserved nor rejected"
[ "$settled" = $((DEMO_ORDERS + 3)) ] || fail "psql: $settled orders settled, want $((DEMO_ORDERS + 3))"
tables=$(psql_in inventory \
	"SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE tablename IN ('stock', 'reservations', 'inbox_messages', 'outbox_messages')")
[ "$tables" = "inbox_messages,outbox_messages,reservations,stock" ] || fail "psql: inventory's migrations did not run ($tables)"
say "ok: psql: $settled paid orders, every one reserved or rejected; both services migrated their databases"

# The dashboard, as a user opens it after the demo: it must become healthy
# and show the same settled orders as psql.
compose start dashboard >/dev/null 2>&1
dash="http://127.0.0.1:${DASHBOARD_PORT:-8090}"
health=
for _ in $(seq 1 60); do
	cid=$(docker ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=dashboard")
	health=$(docker inspect -f '{{.State.Health.Status}}' "$cid" 2>/dev/null || true)
	[ "$health" = healthy ] && break
	sleep 1
done
[ "$health" = healthy ] || fail "the dashboard container is not healthy ($health)"
snap=$(curl -fsS "$dash/snapshot.json") || fail "GET $dash/snapshot.json"
num() { grep -o "\"$1\":[0-9]*" <<<"$snap" | head -1 | cut -d: -f2; }
shown=$(($(num reserved) + $(num rejected)))
[ "$shown" = "$settled" ] || fail "the dashboard shows $shown settled orders, psql $settled"
! grep -q '"errors"' <<<"$snap" || fail "the dashboard reports errors: $snap"
curl -fsS "$dash/" >"$OUT/dashboard.html" || fail "GET $dash/"
grep -q '<html' "$OUT/dashboard.html" || fail "GET $dash/ is not the page"
say "ok: dashboard healthy at $dash, showing the same $shown settled orders"

# The auditor, started again after the demo: it must become healthy and
# have run every check against both services' databases.
compose start auditor >/dev/null 2>&1
auditor="http://127.0.0.1:${AUDITOR_PORT:-8084}"
checks=
for _ in $(seq 1 60); do
	checks=$(curl -fsS "$auditor/status" 2>/dev/null | grep -o '"Check":"[a-z]*"' | sort | tr '\n' ' ') || true
	[ "$checks" = '"Check":"decisions" "Check":"orders" "Check":"refunds" "Check":"sales" "Check":"stock" ' ] && break
	sleep 1
done
[ "$checks" = '"Check":"decisions" "Check":"orders" "Check":"refunds" "Check":"sales" "Check":"stock" ' ] ||
	fail "the auditor did not run its five checks (GET /status: ${checks:-nothing}; see its log)"
findings=$(curl -fsS "$auditor/findings") || fail "GET $auditor/findings"
[ "$findings" = '{"findings":[]}' ] || fail "the auditor found something wrong after the demo: $findings"
say "ok: auditor healthy at $auditor, its five checks running, nothing found"
mark "checks"

# 5. A crash mid-load. A second demo run pays more orders while inventory's
# process is SIGKILLed from the host (`docker kill` would count as a stop
# by hand, which no restart policy undoes; a process that dies is what the
# policy is for), once inventory has applied some of this run's orders and
# still has more to read: compose's `restart: unless-stopped` must start it
# again, and the demo's own checks (nothing lost, nothing applied twice,
# every order of this run settled) must pass over the whole database. The
# control (8.) goes through the same crash.
cid_in() { docker ps -q --filter "label=com.docker.compose.project=$1" --filter "label=com.docker.compose.service=$2" | head -1; }
cid_of() { cid_in "$PROJECT" "$1"; }
wait_healthy() { # wait_healthy PROJECT SERVICE...
	local p=$1 s cid health
	shift
	for s in "$@"; do
		health=
		for _ in $(seq 1 120); do
			cid=$(cid_in "$p" "$s")
			health=$(docker inspect -f '{{.State.Health.Status}}' "$cid" 2>/dev/null || true)
			[ "$health" = healthy ] && break
			sleep 1
		done
		[ "$health" = healthy ] || fail "$s of $p is not healthy ($health)"
	done
}
# psql_with COMPOSE-FUNCTION DATABASE SQL: psql inside that project's
# postgres container, with the password .env gave it.
psql_with() { "$1" exec -T postgres sh -c 'PGPASSWORD="$POSTGRES_PASSWORD" psql -h 127.0.0.1 -U postgres -d "$0" -tAc "$1"' "$2" "$3" | tr -d '[:space:]'; }
APPLIED="SELECT (SELECT count(*) FROM reservations) + (SELECT count(*) FROM rejections)"
# crash_mid_load COMPOSE-FUNCTION PROJECT LOG DEADLINE [COMPOSE-FILE...]:
# up -d, a demo run of 3,000 orders in the background (DEADLINE: how long
# its orders may take to settle), inventory SIGKILLed once it has applied 40
# rows of this run and is still applying more; waits for the demo, whose
# exit code it returns. Sets VICTIM (inventory's container). The load must
# outlast a few looks through docker exec (a quarter second and more each):
# 600 orders were paid in 0.6 s and applied before the second look once the
# relay sent each batch in one produce request.
crash_mid_load() {
	local with=$1 p=$2 log=$3 deadline=$4 files=() f before now pid demo_pid seeded
	shift 4
	for f in "$@"; do files+=(-f "$f"); done
	"$with" up -d --no-build orders inventory provider >>"$OUT/crash.log" 2>&1 || fail "up -d of $p (see $OUT/crash.log)"
	wait_healthy "$p" orders inventory
	VICTIM=$(cid_in "$p" inventory)
	before=$(psql_with "$with" inventory "$APPLIED")
	[[ "$before" =~ ^[0-9]+$ ]] || fail "reading inventory's rows in $p: '$before'"
	( cd "$SNAP" && timeout -k 20 "$TIMEOUT" docker-compose --env-file "$ENV_FILE" -p "$p" "${files[@]}" \
		run --rm -T --no-deps demo -orders 3000 -deadline "$deadline" >"$log" 2>&1 ) &
	demo_pid=$!
	seeded=
	for _ in $(seq 1 240); do
		if grep -q "^seeded" "$log" 2>/dev/null; then seeded=1; break; fi
		sleep 0.25
	done
	[ -n "$seeded" ] || fail "the demo run of $p did not start its load within 60 s (see $log)"
	# Killed while it consumes: 40 rows of this run applied, and more since
	# the last look (so some of them have no committed offset yet).
	prev= consuming=
	for _ in $(seq 1 120); do
		now=$(psql_with "$with" inventory "$APPLIED")
		[[ "$now" =~ ^[0-9]+$ ]] || { sleep 0.25; continue; }
		if [ -n "$prev" ] && [ "$((now - before))" -ge 40 ] && [ "$now" -gt "$prev" ]; then
			consuming=1
			break
		fi
		prev=$now
		sleep 0.25
	done
	[ -n "$consuming" ] || fail "inventory of $p was not consuming the demo's load when it was to be killed (${now:-?} rows, $before before the run)"
	! grep -q '^what happened' "$log" || fail "the demo run of $p was over before the kill: not mid-load"
	pid=$(docker inspect -f '{{if .State.Running}}{{.State.Pid}}{{end}}' "$VICTIM")
	[[ "$pid" =~ ^[1-9][0-9]*$ ]] || fail "inventory of $p is not running (pid '$pid'): nothing to kill"
	kill -KILL "$pid" || fail "SIGKILL of inventory's process $pid"
	say "inventory's process $pid SIGKILLed mid-load, after it applied $((now - before)) rows of the demo's load"
	wait "$demo_pid"
}
crash_mid_load compose "$PROJECT" "$OUT/demo-crash.log" 2m docker-compose.yml ||
	{ tail -30 "$OUT/demo-crash.log"; fail "the demo run across inventory's crash failed (see $OUT/demo-crash.log)"; }
restarts=$(docker inspect -f '{{.RestartCount}}' "$VICTIM")
[ "$restarts" -ge 1 ] || fail "inventory was not restarted by its restart policy (RestartCount $restarts)"
grep -q '^  PASS  exactly-once ' "$OUT/demo-crash.log" && grep -q '^  PASS  nothing-lost ' "$OUT/demo-crash.log" ||
	fail "the demo across the crash does not show exactly-once and nothing-lost passing"
say "ok: inventory SIGKILLed mid-load, restarted by compose ($restarts restart), the demo's checks pass: $(grep -m1 '^every paid order' "$OUT/demo-crash.log")"
mark "crash and restart"

# 5b. The observe profile: Prometheus (a stand-in: Debian's binary) loads
# deploy/prometheus's rules and scrapes both services. Grafana cannot run
# here: Debian does not package it and no registry answers; its dashboard's
# queries are checked against the metrics the services serve by `make test`
# (services/internal/platform/metrics_test.go).
compose --profile observe up -d --no-build --no-deps prometheus >>"$OUT/observe.log" 2>&1 || fail "up of the observe profile's prometheus (see $OUT/observe.log)"
prom="http://127.0.0.1:${PROMETHEUS_PORT:-9090}"
rules= up=
for _ in $(seq 1 60); do
	rules=$(curl -fsS "$prom/api/v1/rules" 2>/dev/null | grep -o '"type":"\(alerting\|recording\)"' | wc -l) || rules=0
	up=$(curl -fsS "$prom/api/v1/targets?state=active" 2>/dev/null | grep -o '"health":"up"' | wc -l) || up=0
	[ "$rules" -gt 0 ] && [ "$up" -ge 2 ] && break
	sleep 1
done
want=$(grep -cE '^ *- (alert|record):' "$SNAP/deploy/prometheus/alerts.yml") || fail "no rule in deploy/prometheus/alerts.yml"
[ "$rules" = "$want" ] || fail "Prometheus loaded $rules rules, deploy/prometheus/alerts.yml has $want"
[ "$up" -ge 2 ] || fail "Prometheus scrapes $up targets up, want orders and inventory"
say "ok: observe profile: Prometheus ($PROMETHEUS_IMAGE) loaded all $rules rules and scrapes orders and inventory; Grafana not run (no image here)"
compose --profile observe rm -sf prometheus >>"$OUT/observe.log" 2>&1 || fail "removing prometheus"
mark "observe profile"

# 6. What users' containers may not do: listen beyond 127.0.0.1 on the host,
# or run as root.
published=0
for cid in $(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT"); do
	name=$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}}' "$cid")
	bindings=$(docker inspect -f '{{range $p, $b := .HostConfig.PortBindings}}{{range $b}}{{$p}}={{.HostIp}} {{end}}{{end}}' "$cid")
	for b in $bindings; do
		[ "${b#*=}" = 127.0.0.1 ] || fail "$name publishes ${b%=*} on '${b#*=}', not 127.0.0.1"
		published=$((published + 1))
	done
done
[ "$published" -ge 4 ] || fail "found $published published ports of kafka, orders, inventory, provider: the check reads nothing"
who=
for s in postgres kafka orders inventory provider auditor; do
	cid=$(cid_of "$s")
	[ -n "$cid" ] || fail "$s is not running"
	uids=$(docker top "$cid" -eo pid,uid | awk 'NR > 1 {print $2}' | sort -u | tr '\n' ' ') || fail "docker top $s"
	[ -n "$uids" ] || fail "docker top $s shows no process"
	case " $uids" in *" 0 "*) fail "$s runs a process as root (uids: $uids)" ;; esac
	who+="$s ${uids% }, "
done
say "ok: $published published ports, each on 127.0.0.1; no process runs as root (uids: ${who%, })"

# 7. down, then up: Postgres and Kafka keep their data on their volumes; the
# consumers go on from their committed offsets (no message comes back to
# an inbox as a redelivery), and Kafka still holds the events.
count() { psql_in "$1" "$2" | tr -d '[:space:]'; }
paid_before=$(count orders "SELECT count(*) FROM orders WHERE status <> 'created'")
dups_before=$(($(count orders "SELECT coalesce(sum(duplicates), 0) FROM inbox_messages") + $(count inventory "SELECT coalesce(sum(duplicates), 0) FROM inbox_messages")))
compose down --timeout 20 >>"$OUT/down-up.log" 2>&1 || fail "docker-compose down (see $OUT/down-up.log)"
compose up -d --no-build orders inventory provider >>"$OUT/down-up.log" 2>&1 || fail "up -d after down (see $OUT/down-up.log)"
wait_healthy "$PROJECT" orders inventory
sleep 10 # a consumer that lost its offsets would be reading everything again by now
paid_after=$(count orders "SELECT count(*) FROM orders WHERE status <> 'created'")
dups_after=$(($(count orders "SELECT coalesce(sum(duplicates), 0) FROM inbox_messages") + $(count inventory "SELECT coalesce(sum(duplicates), 0) FROM inbox_messages")))
[ "$paid_after" = "$paid_before" ] || fail "after down and up: $paid_after paid orders, before $paid_before"
[ "$dups_after" = "$dups_before" ] || fail "after down and up the inboxes suppressed $((dups_after - dups_before)) more duplicates: the consumers read again what they had committed"
# As admin, with the client config the kafka service's healthcheck writes.
offsets=$(compose exec -T kafka /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.GetOffsetShell --bootstrap-server localhost:9092 \
	--command-config /tmp/admin.properties --topic orders.events 2>>"$OUT/down-up.log" |
	awk -F: '{n += $3} END {print n + 0}')
[ "$offsets" -gt "$paid_before" ] || fail "after down and up Kafka holds $offsets records of orders.events, fewer than the $paid_before paid orders"
say "ok: down and up: $paid_after paid orders kept, $offsets records of orders.events kept, no redelivery to an inbox"
# The same read with no login: the broker must refuse it. The tool then
# retries until it gives up or `timeout` stops it (exit 124); anything else
# (the container not running, the tool missing) proves nothing.
set +e
nologin=$(compose exec -T kafka timeout 20 /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.GetOffsetShell \
	--bootstrap-server localhost:9092 --topic orders.events 2>&1)
nologin_rc=$?
set -e
! grep -q '^orders.events:' <<<"$nologin" || fail "compose's Kafka answered a client with no login: $(head -3 <<<"$nologin")"
[ "$nologin_rc" = 124 ] || grep -Eqi 'timeout|timed out|disconnect|authentication|closed' <<<"$nologin" ||
	fail "the no-login read failed for another reason (exit $nologin_rc): $(head -3 <<<"$nologin")"
say "ok: a client with no login read nothing from compose's Kafka (exit $nologin_rc)"
mark "down and up"

# 8. The control: the same crash with the inbox and the domain guard off
# (deploy/ci/control.yml: failpoint builds of the services, the only ones
# that honour those switches) must fail, on exactly-once, with more events
# applied twice (OrderPaid or OrderCaptured) than the demo's one replayed OrderPaid: those inventory
# applied but had not committed the offset of when it was killed. Its own
# project, so the proof's images and volumes are not touched.
compose down -v --remove-orphans --timeout 20 >>"$OUT/down.log" 2>&1 || fail "docker-compose down -v before the control"
control() { (cd "$SNAP" && docker-compose --env-file "$ENV_FILE" -p "$PROJECT-control" -f docker-compose.yml -f deploy/ci/control.yml "$@"); }
CONTROL_STARTED=1
control build orders inventory provider demo kafka-init >"$OUT/control-build.log" 2>&1 || { tail -20 "$OUT/control-build.log"; fail "building the control's failpoint services"; }
set +e
# Its demo gives up after 40 s: orders applied twice never add up.
crash_mid_load control "$PROJECT-control" "$OUT/control-demo.log" 40s docker-compose.yml deploy/ci/control.yml
control_rc=$?
set -e
control logs --no-color inventory >"$OUT/control-inventory.log" 2>&1 || true
control down -v --remove-orphans --timeout 20 >>"$OUT/down.log" 2>&1 || fail "docker-compose down -v of the control"
CONTROL_STARTED=
[ "$control_rc" != 0 ] || fail "the control run (inbox and domain guard off) passed: the demo's checks cannot see a message applied twice"
line=$(grep -Em1 'FAIL +exactly-once' "$OUT/control-demo.log") ||
	{ tail -30 "$OUT/control-demo.log"; fail "the control run failed (exit $control_rc), but not on exactly-once (see $OUT/control-demo.log)"; }
# A redelivery across the crash is an OrderPaid applied twice or an
# OrderCaptured whose units are sold twice, whichever inventory was reading
# when it died; the demo's replay adds one OrderPaid applied twice.
applied=$(sed -nE 's/.*; ([0-9]+) applied more than once;.*/\1/p' <<<"$line")
sold=$(sed -nE 's/.*, ([0-9]+) sold more than once.*/\1/p' <<<"$line")
twice=$((${applied:-0} + ${sold:-0}))
[ "$twice" -gt 1 ] ||
	fail "the control applied ${applied:-0} orders twice and sold ${sold:-0} twice: no more than the demo's replay, so the check did not see the crash's redeliveries ($line)"
say "ok: the control (inbox and domain guard off) failed, as it must: ${applied:-0} orders applied twice, ${sold:-0} sold twice across the crash: ${line#*FAIL}"
mark "control run"

# 8. Down -v; then nothing of the project may be left (finish checks).
STARTED=
trap - EXIT
compose down -v --remove-orphans --timeout 20 >"$OUT/down.log" 2>&1 || fail "docker-compose down -v failed (see $OUT/down.log)"
left=$(
	for p in "$PROJECT" "$PROJECT-control"; do
		docker ps -aq --filter "label=com.docker.compose.project=$p"
		docker network ls -q --filter "label=com.docker.compose.project=$p"
		docker volume ls -q --filter "label=com.docker.compose.project=$p"
	done
)
rm -rf "$SNAP"
[ -z "$left" ] || fail "left behind after down -v: $left"
say "ok: down -v: no container, network or volume of project $PROJECT left"
mark "down -v"

echo
say "timings:"
printf '%s\n' "${TIMES[@]}"
printf '  %-34s %4ds\n' total $((SECONDS - START))
say "PASS"
