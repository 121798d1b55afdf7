// Package kafkadist carries deploy/kafka/pom.xml, the Maven Central
// coordinates of Apache Kafka's broker, into Go programs: chaos/stack
// writes it to its jar cache and resolves it with Maven, so the real broker
// starts the same way from a test, the demo and the chaos harness, whatever
// their working directory.
package kafkadist

import (
	_ "embed"
	"regexp"
)

// POM is deploy/kafka/pom.xml.
//
//go:embed pom.xml
var POM []byte

// Version is the Apache Kafka version the pom pins (its kafka.version
// property): the version of docker-compose.yml's apache/kafka image.
var Version = string(regexp.MustCompile(`<kafka\.version>([^<]+)</kafka\.version>`).FindSubmatch(POM)[1])
