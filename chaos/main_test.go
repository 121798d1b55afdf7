package main

import (
	"strings"
	"testing"
)

// The last line of a failed run names each failed invariant with its
// detail, cut short: CI keeps only the tail of a long log.
func TestFailedBriefNamesEachFailure(t *testing.T) {
	r := &Report{
		Failed: "attribution,faults-bit",
		Details: map[string]string{
			"attribution":  "after-commit-before-ack: no kill of orders's own messages",
			"faults-bit":   strings.Repeat("é", 400),
			"exactly-once": "held",
		},
	}
	got := failedBrief(r)
	for _, want := range []string{"attribution (after-commit-before-ack: no kill of orders's own messages)", "faults-bit (" + strings.Repeat("é", 300) + "…)"} {
		if !strings.Contains(got, want) {
			t.Errorf("failedBrief = %q, want it to contain %q", got, want)
		}
	}
	if strings.Contains(got, "exactly-once") {
		t.Errorf("failedBrief = %q names an invariant that held", got)
	}
}
