// Command kafkajars prints the directory of Apache Kafka's jars (the
// version deploy/kafka/pom.xml pins), resolving them with Maven into the
// cache first when needed (stack.ApacheJars): what deploy/ci/standins.sh
// copies into its stand-in of the apache/kafka image.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/outboxref/outbox-inbox/chaos/stack"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("kafkajars: ")
	dir, err := stack.ApacheJars(context.Background(), func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "kafkajars: "+format+"\n", args...)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dir)
}
