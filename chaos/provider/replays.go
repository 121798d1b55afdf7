package provider

import (
	"bufio"
	"os"
	"regexp"
	"strings"
)

// replayedMsg is the log message of a request answered with the stored
// response (api.go).
const replayedMsg = `msg="replayed the stored response"`

var keyField = regexp.MustCompile(`\bkey=(\S+)`)

// ReadReplays counts, per idempotency key, the requests a provider
// answered with the stored response, from its log (a text slog log, as Run
// writes it): what the chaos harness and the narrated scenarios read to
// show that a repeated call was not executed again.
func ReadReplays(logPath string) (map[string]int, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, replayedMsg) {
			continue
		}
		if m := keyField.FindStringSubmatch(line); m != nil {
			counts[strings.Trim(m[1], `"`)]++
		}
	}
	return counts, sc.Err()
}
