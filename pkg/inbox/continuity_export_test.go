package inbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// CheckContinuityOf runs the continuity check on msgs as one batch of
// fresh deliveries in tx (read as the inbox reads them, on topic), and
// returns each one's breaches: the batch statement, which a batch of the
// router's meets only when several partitions deliver at once.
func (in *Inbox) CheckContinuityOf(ctx context.Context, tx pgx.Tx, topic string, msgs []*message.Message) ([][]Breach, error) {
	ds := make([]*delivery, len(msgs))
	fresh := make([]int, len(msgs))
	for i, msg := range msgs {
		d, reason := in.read(msg)
		if reason != "" {
			return nil, fmt.Errorf("message %d: %s", i, reason)
		}
		d.topic = topic
		ds[i], fresh[i] = d, i
	}
	if err := in.checkContinuity(ctx, tx, ds, fresh); err != nil {
		return nil, err
	}
	out := make([][]Breach, len(ds))
	for i, d := range ds {
		out[i] = d.breaches
	}
	return out, nil
}
