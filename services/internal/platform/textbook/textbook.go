// Package textbook is the benchmark's baseline relay: the outbox relay as the
// well-known articles build it from Watermill's own parts. watermill-sql's
// polling Subscriber, with its default settings (a 1s poll, batches of 100
// rows locked FOR UPDATE, each handed over and acknowledged one at a time),
// reads outbox_messages; a router handler republishes each message to Kafka
// with watermill-kafka's Publisher, one synchronous send per message. It is
// the Forwarder's engine (SQL subscriber → router → publisher) over this
// project's outbox table. Services run it with RELAY_DRIVER=textbook; nothing
// else should.
package textbook

import (
	"context"
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const topicMetadata = "outbox_topic"

// Run relays until ctx ends.
func Run(ctx context.Context, pool *pgxpool.Pool, publisher message.Publisher, logger watermill.LoggerAdapter) error {
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		SchemaAdapter:  schema{},
		OffsetsAdapter: offsets{},
	}, logger)
	if err != nil {
		return fmt.Errorf("textbook relay: %w", err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddConsumerHandler("textbook-relay", "outbox_messages", sub, func(msg *message.Message) error {
		topic := msg.Metadata.Get(topicMetadata)
		out := message.NewMessage(msg.UUID, msg.Payload)
		for k, v := range msg.Metadata {
			if k != topicMetadata {
				out.Metadata.Set(k, v)
			}
		}
		return publisher.Publish(topic, out)
	})
	go func() {
		<-ctx.Done()
		router.Close() //nolint:errcheck
	}()
	return router.Run(context.WithoutCancel(ctx))
}

// schema adapts outbox_messages to watermill-sql's SchemaAdapter, and
// offsets to its OffsetsAdapter, like watermill-sql's own queue schema:
// publishing a row marks it.
type schema struct{}

type offsets struct{}

func (schema) SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams) ([]wsql.Query, error) {
	return nil, nil // outbox.Migrate owns the table
}

func (schema) InsertQuery(wsql.InsertQueryParams) (wsql.Query, error) {
	return wsql.Query{}, errors.New("textbook relay only reads; write with outbox.PublishTx")
}

func (schema) SelectQuery(wsql.SelectQueryParams) (wsql.Query, error) {
	return wsql.Query{Query: `
		SELECT id, message_id::text, payload, metadata, topic FROM outbox_messages
		WHERE published_at IS NULL
		ORDER BY id
		LIMIT 100
		FOR UPDATE`, Args: []any{planEachTime}}, nil
}

func (schema) UnmarshalMessage(p wsql.UnmarshalMessageParams) (wsql.Row, error) {
	var r wsql.Row
	var topic string
	if err := p.Row.Scan(&r.Offset, &r.UUID, &r.Payload, &r.Metadata, &topic); err != nil {
		return wsql.Row{}, fmt.Errorf("scanning outbox row: %w", err)
	}
	msg := message.NewMessage(string(r.UUID), r.Payload)
	if err := json.Unmarshal(r.Metadata, &msg.Metadata); err != nil {
		return wsql.Row{}, fmt.Errorf("outbox row %d metadata: %w", r.Offset, err)
	}
	msg.Metadata.Set(topicMetadata, topic)
	r.Msg = msg
	return r, nil
}

func (schema) SubscribeIsolationLevel() stdsql.IsolationLevel { return stdsql.LevelReadCommitted }

func (offsets) AckMessageQuery(p wsql.AckMessageQueryParams) (wsql.Query, error) {
	ids := make([]int64, len(p.Rows))
	for i, r := range p.Rows {
		ids[i] = r.Offset
	}
	return wsql.Query{Query: `UPDATE outbox_messages SET published_at = now() WHERE id = ANY($1)`, Args: []any{planEachTime, ids}}, nil
}

// planEachTime has Postgres plan these statements for the table as it is
// (see pkg/outbox's planEachTime): with plans cached while the table was
// empty, the baseline would measure sequential scans, not the pattern.
var planEachTime = pgx.QueryExecModeExec

func (offsets) ConsumedMessageQuery(wsql.ConsumedMessageQueryParams) (wsql.Query, error) {
	return wsql.Query{}, nil
}

func (offsets) NextOffsetQuery(wsql.NextOffsetQueryParams) (wsql.Query, error) {
	return wsql.Query{}, nil
}

func (offsets) BeforeSubscribingQueries(wsql.BeforeSubscribingQueriesParams) ([]wsql.Query, error) {
	return nil, nil
}

func (offsets) SchemaInitializingQueries(wsql.OffsetsSchemaInitializingQueriesParams) ([]wsql.Query, error) {
	return nil, nil
}
