package stack

import (
	"context"
	"os"
	"testing"
)

// ApacheRuntime returns the java binary and the directory of Apache Kafka's
// jars that StartApache runs, for a caller that starts the broker's classes
// itself with a configuration of its own (services/compose_kafka_test.go
// runs docker-compose.yml's Kafka settings through the image's
// kafka.docker.KafkaDockerWrapper and kafka.Kafka). The jars are resolved as
// ApacheJars does; log, when set, receives its lines.
func ApacheRuntime(ctx context.Context, log func(string, ...any)) (java, libs string, err error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	if java, err = findJava(); err != nil {
		return "", "", err
	}
	if libs, err = ApacheJars(ctx, log); err != nil {
		return "", "", err
	}
	return java, libs, nil
}

// RequireApache is ApacheRuntime for a test. On a machine without java, or
// without the jars and the mvn to resolve them, it skips t and says why;
// with REQUIRE_APACHE_KAFKA set (CI has a JDK and Maven) it fails t instead,
// so the real-Kafka tests cannot pass there by being skipped.
func RequireApache(t testing.TB) (java, libs string) {
	t.Helper()
	java, libs, err := ApacheRuntime(context.Background(), t.Logf)
	if err != nil {
		if os.Getenv("REQUIRE_APACHE_KAFKA") != "" {
			t.Fatalf("REQUIRE_APACHE_KAFKA is set: %v", err)
		}
		t.Skipf("skipping the real-Kafka test: %v", err)
	}
	return java, libs
}
