#!/usr/bin/env bash
# without-postgres.sh COMMAND...: runs COMMAND as on a machine where no
# Postgres is installed: in a mount namespace of its own (unshare, as root),
# Debian's server binaries (/usr/lib/postgresql) are an empty directory,
# pg_ctl is on no PATH, and the postgres OS user is gone from /etc/passwd.
# pkg/pgtest then fetches its Postgres from Maven Central (registry.go).
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
	echo "without-postgres.sh: needs root (a mount namespace hides the installed Postgres)" >&2
	exit 2
fi
empty=$(mktemp -d)
passwd=$(mktemp)
grep -v '^postgres:' /etc/passwd >"$passwd"
chmod 644 "$passwd"
trap 'rm -rf "$empty" "$passwd"' EXIT
# shellcheck disable=SC2016 # expanded inside the namespace
exec unshare -m --propagation private bash -c '
	set -euo pipefail
	empty=$1 passwd=$2; shift 2
	[ -d /usr/lib/postgresql ] && mount --bind "$empty" /usr/lib/postgresql
	mount --bind "$passwd" /etc/passwd
	if command -v pg_ctl >/dev/null 2>&1; then mount --bind "$empty" "$(dirname "$(command -v pg_ctl)")"; fi
	if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || id postgres >/dev/null 2>&1 || command -v pg_ctl >/dev/null 2>&1; then
		echo "without-postgres.sh: Postgres is still visible" >&2; exit 1
	fi
	echo "without-postgres.sh: no Postgres installed here: $*"
	exec "$@"
' without-postgres "$empty" "$passwd" "$@"
