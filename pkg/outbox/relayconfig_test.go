package outbox_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

func TestNewRelay(t *testing.T) {
	t.Parallel()

	pool, err := pgxpool.New(t.Context(), testPG.URL("postgres")) // never connects: no query is run
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pub := newPublisher(t)

	tests := []struct {
		name    string
		cfg     outbox.RelayConfig
		wantErr string
	}{
		{"NoPool", outbox.RelayConfig{Publisher: pub}, "RelayConfig.Pool"},
		{"NoPublisher", outbox.RelayConfig{Pool: pool}, "RelayConfig.Publisher"},
		{"NegativeBatchSize", outbox.RelayConfig{Pool: pool, Publisher: pub, BatchSize: -1}, "RelayConfig.BatchSize"},
		{"PollIntervalTooShort", outbox.RelayConfig{Pool: pool, Publisher: pub, PollInterval: time.Microsecond}, "RelayConfig.PollInterval"},
		{"NegativeRetention", outbox.RelayConfig{Pool: pool, Publisher: pub, Retention: -time.Second}, "RelayConfig.Retention"},
		{"NegativeErrorBackoff", outbox.RelayConfig{Pool: pool, Publisher: pub, ErrorBackoff: -time.Second}, "RelayConfig.ErrorBackoff"},
		{"NegativeBatchTimeout", outbox.RelayConfig{Pool: pool, Publisher: pub, BatchTimeout: -time.Second}, "RelayConfig.BatchTimeout"},
		{"NegativeRetentionInterval", outbox.RelayConfig{Pool: pool, Publisher: pub, RetentionInterval: -time.Second}, "RelayConfig.RetentionInterval"},
		{"NegativeRetentionBatch", outbox.RelayConfig{Pool: pool, Publisher: pub, RetentionBatch: -1}, "RelayConfig.RetentionBatch"},
		{"MaxErrorBackoffBelowErrorBackoff", outbox.RelayConfig{Pool: pool, Publisher: pub, ErrorBackoff: time.Second, MaxErrorBackoff: time.Millisecond}, "RelayConfig.MaxErrorBackoff"},
		{"NegativeMaxMessageBytes", outbox.RelayConfig{Pool: pool, Publisher: pub, MaxMessageBytes: -1}, "RelayConfig.MaxMessageBytes"},
		{"Defaults", outbox.RelayConfig{Pool: pool, Publisher: pub}, ""},
		{"LongErrorBackoffRaisesTheDefaultCap", outbox.RelayConfig{Pool: pool, Publisher: pub, ErrorBackoff: time.Hour}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			relay, err := outbox.NewRelay(tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NotNil(t, relay)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			require.Nil(t, relay)
		})
	}
}
