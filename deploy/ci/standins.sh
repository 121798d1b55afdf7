#!/usr/bin/env bash
# Builds the local stand-ins for the official base images that
# docker-compose.yml names, on a machine with no container registry:
#
#   outbox-ci/debian:bookworm    debootstrap --variant=minbase bookworm, docker import
#   outbox-ci/golang:<go ver>    that + the host's Go toolchain    (for golang:1.26.8-bookworm)
#   outbox-ci/postgres:15-<hash> that + Debian's postgresql-15 and an
#                                entrypoint with the official image's contract
#                                (for postgres:15.18-bookworm)
#   outbox-ci/kafka:4.1.0-<hash> that + Debian's JRE 17 + Apache Kafka's jars
#                                from Maven Central (cmd/kafkajars, the
#                                chaos proof's) + a launch script doing what
#                                the image's does (for apache/kafka:4.1.0)
#   outbox-ci/prometheus:<ver>   that + Debian's prometheus binary, laid out
#                                as prom/prometheus (for the observe profile)
#
# Grafana has no stand-in: Debian does not package it, and no registry
# answers here; compose-ci says so.
#
# Each is built once and kept: an image whose tag exists is not rebuilt
# (the postgres and kafka tags carry a hash of their recipes, kafka's of its
# jars too). The final stage of the service images is
# `scratch`, which needs no stand-in. Prints the variables to export.
#
#   deploy/ci/standins.sh            build what is missing
#   deploy/ci/standins.sh --rebuild  build all five again
set -euo pipefail
cd "$(dirname "$0")/standins"
ROOT=$(cd ../../.. && pwd)

BASE_IMAGE=outbox-ci/debian:bookworm
GO_VERSION=$(go env GOVERSION)
GO_VERSION=${GO_VERSION#go}
GO_IMAGE=outbox-ci/golang:$GO_VERSION
# Tagged with a hash of its recipe: editing the entrypoint rebuilds it.
POSTGRES_IMAGE=outbox-ci/postgres:15-$(cat postgres-setup.sh postgres-entrypoint.sh | sha256sum | cut -c1-12)
KAFKA_LIBS=$(cd "$ROOT" && go run ./cmd/kafkajars)
KAFKA_VERSION=$(cd "$ROOT" && sed -n 's#.*<kafka.version>\(.*\)</kafka.version>.*#\1#p' deploy/kafka/pom.xml)
KAFKA_IMAGE=outbox-ci/kafka:$KAFKA_VERSION-$(cat kafka-setup.sh kafka-run kafka-bin/* "$KAFKA_LIBS/../manifest" | sha256sum | cut -c1-12)
if ! command -v prometheus >/dev/null; then
	echo "standins: installing Debian's prometheus (its binary becomes the Prometheus stand-in)" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
PROMETHEUS_BIN=$(command -v prometheus)
PROMETHEUS_IMAGE=outbox-ci/prometheus:$(prometheus --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\).*/\1/p' | tr '+~' '--')-$(cat "$PROMETHEUS_BIN" "$ROOT/deploy/ci/standins.sh" | sha256sum | cut -c1-12)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

rebuild=
[ "${1:-}" = --rebuild ] && rebuild=1

have() { [ -z "$rebuild" ] && docker image inspect "$1" >/dev/null 2>&1; }
log() { echo "standins: $*" >&2; }
# quiet CMD...: runs CMD with its output kept aside, shown only if it fails.
quiet() {
	local out
	out=$(mktemp)
	if ! "$@" >"$out" 2>&1; then
		tail -40 "$out" >&2
		rm -f "$out"
		return 1
	fi
	rm -f "$out"
}

if have "$BASE_IMAGE"; then
	log "$BASE_IMAGE: cached"
else
	if ! command -v debootstrap >/dev/null; then
		log "installing debootstrap"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
	fi
	root=$(mktemp -d /var/tmp/outbox-ci-root.XXXXXX)
	trap 'rm -rf "$root"' EXIT
	log "$BASE_IMAGE: debootstrap bookworm from $MIRROR (a few minutes, once)"
	start=$SECONDS
	debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$MIRROR" >"$root.log" 2>&1 ||
		{ tail -20 "$root.log" >&2; exit 1; }
	rm -f "$root.log"
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
	tar -C "$root" -c . | docker import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
	rm -rf "$root"
	trap - EXIT
	log "$BASE_IMAGE: built in $((SECONDS - start))s"
fi

build_go() {
	if have "$GO_IMAGE"; then
		log "$GO_IMAGE: cached"
	else
		# Imported, not built: the base's files + the toolchain + the host's CA
		# bundle in one tar is several times faster than COPYing 270 MB through
		# the builder. The CA bundle: this machine reaches the Go module proxy
		# through a TLS-intercepting egress proxy that only the host's bundle
		# trusts, and `go mod download` runs in the build stage.
		start=$SECONDS
		goroot=$(go env GOROOT)
		log "$GO_IMAGE: $BASE_IMAGE + $goroot"
		dir=$(mktemp -d /var/tmp/outbox-ci-go.XXXXXX)
		trap 'rm -rf "$dir"' EXIT
		cid=$(docker create "$BASE_IMAGE" true)
		docker export "$cid" | tar -x -C "$dir"
		docker rm "$cid" >/dev/null
		cp -a "$goroot" "$dir/usr/local/go"
		cp -L /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
		mkdir -p "$dir/go/bin" "$dir/go/src"
		chmod -R 1777 "$dir/go"
		# The official image's environment.
		tar -C "$dir" -c . | docker import \
			--change "ENV GOLANG_VERSION=$GO_VERSION" \
			--change 'ENV GOTOOLCHAIN=local' \
			--change 'ENV GOPATH=/go' \
			--change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'WORKDIR /go' \
			--change 'CMD ["bash"]' - "$GO_IMAGE" >/dev/null
		rm -rf "$dir"
		trap - EXIT
		docker run --rm "$GO_IMAGE" go version >&2
		log "$GO_IMAGE: built in $((SECONDS - start))s"
	fi
}

build_postgres() {
	if have "$POSTGRES_IMAGE"; then
		log "$POSTGRES_IMAGE: cached"
	else
		# docker run + one commit, not docker build: every builder step is a
		# commit, and commits are slow on this machine's storage driver.
		start=$SECONDS
		log "$POSTGRES_IMAGE: $BASE_IMAGE + Debian's postgresql-15"
		docker rm -f outbox-ci-postgres-standin >/dev/null 2>&1 || true
		quiet docker run --name outbox-ci-postgres-standin -v "$PWD:/standins:ro" "$BASE_IMAGE" /standins/postgres-setup.sh
		docker commit \
			--change 'ENV LANG=C.UTF-8' \
			--change 'ENV PG_MAJOR=15' \
			--change 'ENV PGDATA=/var/lib/postgresql/data' \
			--change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'VOLUME /var/lib/postgresql/data' \
			--change 'EXPOSE 5432' \
			--change 'ENTRYPOINT ["docker-entrypoint.sh"]' \
			--change 'CMD ["postgres"]' \
			outbox-ci-postgres-standin "$POSTGRES_IMAGE-wip" >/dev/null
		docker rm outbox-ci-postgres-standin >/dev/null
		# commit --change cannot set STOPSIGNAL (SIGINT: a fast shutdown, as
		# the official image stops); a one-step build can.
		printf 'FROM %s\nSTOPSIGNAL SIGINT\n' "$POSTGRES_IMAGE-wip" | quiet docker build -t "$POSTGRES_IMAGE" -
		docker rmi "$POSTGRES_IMAGE-wip" >/dev/null
		log "$POSTGRES_IMAGE: built in $((SECONDS - start))s"
	fi
}

build_kafka() {
	if have "$KAFKA_IMAGE"; then
		log "$KAFKA_IMAGE: cached"
	else
		start=$SECONDS
		log "$KAFKA_IMAGE: $BASE_IMAGE + Debian's JRE 17 + $KAFKA_LIBS"
		docker rm -f outbox-ci-kafka-standin >/dev/null 2>&1 || true
		quiet docker run --name outbox-ci-kafka-standin -v "$PWD:/standins:ro" -v "$KAFKA_LIBS:/libs:ro" "$BASE_IMAGE" /standins/kafka-setup.sh
		# The image's settings (docker/jvm/Dockerfile).
		docker commit \
			--change 'USER appuser' \
			--change 'WORKDIR /opt/kafka' \
			--change 'ENV PATH=/opt/kafka/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'VOLUME /var/lib/kafka/data' \
			--change 'EXPOSE 9092' \
			--change 'CMD ["/etc/kafka/docker/run"]' \
			outbox-ci-kafka-standin "$KAFKA_IMAGE" >/dev/null
		docker rm outbox-ci-kafka-standin >/dev/null
		log "$KAFKA_IMAGE: built in $((SECONDS - start))s"
	fi
}

# The three images are independent: build them side by side.
# Prometheus: Debian's binary (the package CI installs for promtool) on the
# base image, laid out as prom/prometheus is: /bin/prometheus as the
# entrypoint, /prometheus its working and data directory, user nobody.
# Debian builds its binary with another default data directory
# (/var/lib/prometheus/metrics2, where prom/prometheus's is data/): made
# writable too, since the compose file passes only --config.file.
build_prometheus() {
	if have "$PROMETHEUS_IMAGE"; then
		log "$PROMETHEUS_IMAGE: cached"
	else
		start=$SECONDS
		dir=$(mktemp -d /var/tmp/outbox-ci-prometheus.XXXXXX)
		trap 'rm -rf "$dir"' EXIT
		cp "$PROMETHEUS_BIN" "$dir/prometheus"
		cat >"$dir/Dockerfile" <<-EOF
			FROM $BASE_IMAGE
			COPY prometheus /bin/prometheus
			RUN mkdir -p /prometheus /etc/prometheus /var/lib/prometheus/metrics2 && chown -R nobody:nogroup /prometheus /var/lib/prometheus
			USER nobody
			WORKDIR /prometheus
			EXPOSE 9090
			VOLUME ["/prometheus"]
			ENTRYPOINT ["/bin/prometheus"]
			CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
		EOF
		quiet docker build -t "$PROMETHEUS_IMAGE" "$dir"
		rm -rf "$dir"
		trap - EXIT
		log "$PROMETHEUS_IMAGE: $BASE_IMAGE + $PROMETHEUS_BIN, built in $((SECONDS - start))s"
	fi
}

( build_go ) &
go_pid=$!
( build_postgres ) &
pg_pid=$!
( build_kafka ) &
kafka_pid=$!
( build_prometheus ) &
prometheus_pid=$!
failed=
wait "$go_pid" || failed=1
wait "$pg_pid" || failed=1
wait "$kafka_pid" || failed=1
wait "$prometheus_pid" || failed=1
[ -z "$failed" ] || { log "FAILED"; exit 1; }

# Stand-ins of other Go versions or recipes are of no further use.
for repo in outbox-ci/golang outbox-ci/postgres outbox-ci/kafka outbox-ci/prometheus; do
	docker images --format '{{.Repository}}:{{.Tag}}' "$repo"
done | grep -vxF -e "$GO_IMAGE" -e "$POSTGRES_IMAGE" -e "$KAFKA_IMAGE" -e "$PROMETHEUS_IMAGE" | xargs -r docker rmi >/dev/null || true

echo "GO_IMAGE=$GO_IMAGE"
echo "POSTGRES_IMAGE=$POSTGRES_IMAGE"
echo "KAFKA_IMAGE=$KAFKA_IMAGE"
echo "PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE"
