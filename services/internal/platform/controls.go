//go:build !failpoint

package platform

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// checkControls refuses the control runs' switches in a default build.
// Each turns a guarantee off (the inbox, the domain guard, the effect's
// idempotency key, the relays' order) or swaps the relay for one the
// benchmark compares, so that the chaos harness can show the failure the
// guarantee prevents; only a failpoint build (-tags failpoint), which is
// what the harness, the demo and the benchmark run, honours them. A
// default build that sees one set stops and names it, rather than run
// without the guarantee.
func checkControls(cfg Config) error {
	if set := controlsSet(cfg); len(set) > 0 {
		return fmt.Errorf("%s: a switch that turns a guarantee off, which only a failpoint build (-tags failpoint: the chaos harness's control runs) honours; this is a default build: unset it",
			strings.Join(set, ", "))
	}
	return nil
}

// withControls returns c as it is: a default build applies no control.
func withControls(_ Config, c inbox.Config) inbox.Config { return c }

// withBadDeploy returns fn as it is: a default build has no bad deploy.
func withBadDeploy(_ Config, fn inbox.BatchFunc) inbox.BatchFunc { return fn }

// runTextbook is not in a default build.
func runTextbook(context.Context, *pgxpool.Pool, message.Publisher, watermill.LoggerAdapter) error {
	return errors.New("RELAY_DRIVER=textbook: the benchmark's relay is in failpoint builds only")
}
