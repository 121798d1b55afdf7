package main

import (
	"context"
	"fmt"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

func runScenario(ctx context.Context, w failpoint.Name) error {
	return fmt.Errorf("scenario %s: not written yet", w)
}
