package kafkadist

import (
	"os"
	"regexp"
	"testing"
)

// The real broker this project tests on is the one docker-compose.yml runs.
func TestVersionMatchesCompose(t *testing.T) {
	compose, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`apache/kafka:([0-9][^}\s"]*)`).FindAllSubmatch(compose, -1)
	if len(m) == 0 {
		t.Fatal("docker-compose.yml names no apache/kafka image")
	}
	for _, img := range m {
		if string(img[1]) != Version {
			t.Errorf("docker-compose.yml runs apache/kafka:%s, deploy/kafka/pom.xml pins %s", img[1], Version)
		}
	}
}
