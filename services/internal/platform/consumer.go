package platform

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
)

// watchStalls runs the consumer's stall watchdog until ctx ends. A stall
// ends the service: its goroutines are written to stderr (where the claim
// or the delivery waits), and Run returns the error, so the process exits
// and its supervisor starts it again with a new group session.
func watchStalls(ctx context.Context, w *inboxkafka.Watchdog, log *slog.Logger) error {
	err := w.Run(ctx)
	if errors.Is(err, inboxkafka.ErrStalled) {
		log.Error("consumer stalled: exiting so that a new process takes its partitions; its goroutines follow on stderr", "err", err)
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1) //nolint:errcheck // best effort, on the way out
	}
	return err
}

// clientID is s with every character Kafka's client.id does not allow
// (A-Z a-z 0-9 . _ -) replaced by '_'.
func clientID(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, s)
}
