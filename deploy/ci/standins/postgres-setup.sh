#!/usr/bin/env bash
# Runs inside a container of outbox-ci/debian:bookworm (deploy/ci/standins.sh
# then commits it as the postgres stand-in): Debian bookworm's postgresql-15
# laid out like the official postgres image, with its entrypoint contract
# (postgres-entrypoint.sh beside this file).
set -euxo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql-common >/dev/null
# Like the official image: no cluster at install, the entrypoint makes one in $PGDATA.
sed -ri 's/#(create_main_cluster) .*$/\1 = false/' /etc/postgresql-common/createcluster.conf
apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
install -m 755 /standins/postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
mkdir -p /docker-entrypoint-initdb.d /var/lib/postgresql/data /var/run/postgresql
chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql
chmod 1777 /var/lib/postgresql/data
chmod 3777 /var/run/postgresql
/usr/lib/postgresql/15/bin/postgres --version
