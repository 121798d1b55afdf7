#!/usr/bin/env bash
# CI stand-in for the official postgres image's docker-entrypoint.sh: the
# part of its contract docker-compose.yml relies on.
#   - runs the server as the postgres user (re-executes itself as it);
#   - on an empty $PGDATA: initdb with POSTGRES_USER / POSTGRES_PASSWORD,
#     trust on the socket and 127.0.0.1, POSTGRES_HOST_AUTH_METHOD
#     (scram-sha-256) from anywhere else, POSTGRES_DB created, then every
#     /docker-entrypoint-initdb.d/*.sql (psql) and *.sh (sourced) run against
#     a temporary server that listens on the socket only;
#   - then execs the server, listening on all addresses.
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
	set -- postgres "$@"
fi

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown -R postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_PASSWORD:?is required (as by the official image)}"
	user=${POSTGRES_USER:-postgres}
	db=${POSTGRES_DB:-$user}
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of arguments
	initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") ${POSTGRES_INITDB_ARGS:-}
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	printf '\nhost all all all %s\n' "${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >>"$PGDATA/pg_hba.conf"

	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
	export PGUSER=$user PGPASSWORD=$POSTGRES_PASSWORD PGHOST=/var/run/postgresql
	if [ "$db" != postgres ]; then
		psql -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE \"$db\""
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh)
			echo "$0: sourcing $f"
			# shellcheck disable=SC1090
			. "$f"
			;;
		*.sql)
			echo "$0: running $f"
			psql -v ON_ERROR_STOP=1 -d "$db" -f "$f"
			;;
		*) echo "$0: ignoring $f" ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	unset PGUSER PGPASSWORD PGHOST
	echo
	echo 'PostgreSQL init process complete; ready for start up.'
	echo
fi

exec "$@"
