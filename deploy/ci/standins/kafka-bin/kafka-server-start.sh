#!/bin/sh
# Stand-in for bin/kafka-server-start.sh. Half the image's 1 GiB heap: CI
# runs it beside Postgres and the services on two cores.
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m} \
	KAFKA_JVM_PERFORMANCE_OPTS=${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20} \
	KAFKA_LOG4J_CONFIG=/opt/kafka/config/log4j2.yaml \
	exec "$(dirname "$0")/kafka-run-class.sh" kafka.Kafka "$@"
