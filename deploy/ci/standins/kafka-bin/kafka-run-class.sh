#!/bin/sh
# Stand-in for the distribution's bin/kafka-run-class.sh: java with every jar.
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1} \
	-Djava.awt.headless=true -Dlog4j2.configurationFile="${KAFKA_LOG4J_CONFIG:-/opt/kafka/bin/tools-log4j2.yaml}" \
	-cp '/opt/kafka/libs/*' "$@"
