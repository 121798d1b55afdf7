package inbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// CheckContinuityOf writes the inbox rows of msgs as one batch in tx (read
// as the inbox reads them, on topic), which checks their continuity, and
// returns each one's breaches: the batch statement, which a batch of the
// router's meets only when several partitions deliver at once.
func (in *Inbox) CheckContinuityOf(ctx context.Context, tx pgx.Tx, topic string, msgs []*message.Message) ([][]Breach, error) {
	ds := make([]*delivery, len(msgs))
	for i, msg := range msgs {
		d, reason := in.read(msg)
		if reason != "" {
			return nil, fmt.Errorf("message %d: %s", i, reason)
		}
		d.topic = topic
		ds[i] = d
	}
	if _, err := in.insertRows(ctx, tx, ds, rowProcessed); err != nil {
		return nil, err
	}
	out := make([][]Breach, len(ds))
	for i, d := range ds {
		out[i] = d.breaches
	}
	return out, nil
}
