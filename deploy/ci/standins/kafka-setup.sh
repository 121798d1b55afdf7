#!/usr/bin/env bash
# Runs inside a container of outbox-ci/debian:bookworm with Apache Kafka's
# jars mounted at /libs (deploy/ci/standins.sh then commits it as the kafka
# stand-in): Debian's JRE 17 and the jars the chaos proof runs, laid out as
# the apache/kafka image lays out its distribution. Its launch script
# (kafka-run) configures the broker the way the image's does, with the same
# class, kafka.docker.KafkaDockerWrapper.
set -euxo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
# The image's user (uid 1000) and directories.
useradd --uid 1000 --no-create-home --home-dir /opt/kafka --shell /bin/bash appuser
mkdir -p /opt/kafka/libs /opt/kafka/bin /opt/kafka/config /etc/kafka/docker /var/lib/kafka/data /mnt/shared/config
cp /libs/*.jar /opt/kafka/libs/
install -m 755 /standins/kafka-run /etc/kafka/docker/run
for tool in kafka-run-class kafka-server-start kafka-topics kafka-broker-api-versions kafka-storage; do
	install -m 755 "/standins/kafka-bin/$tool.sh" "/opt/kafka/bin/$tool.sh"
done
install -m 644 /standins/kafka-bin/log4j2.yaml /etc/kafka/docker/log4j2.yaml
install -m 644 /standins/kafka-bin/tools-log4j2.yaml /opt/kafka/bin/tools-log4j2.yaml
chown -R appuser:appuser /opt/kafka /etc/kafka /var/lib/kafka /mnt/shared
java -version
