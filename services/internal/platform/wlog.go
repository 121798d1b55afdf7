package platform

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// quietLogger is Watermill's slog adapter with its per-message levels checked
// first: the router logs Trace and Debug lines for every message, and the
// adapter converts their fields to slog attributes before slog drops them.
// Checking the level up front makes a disabled level cost nothing.
type quietLogger struct {
	watermill.LoggerAdapter
	log *slog.Logger
}

func newWatermillLogger(log *slog.Logger) watermill.LoggerAdapter {
	return quietLogger{LoggerAdapter: watermill.NewSlogLogger(log), log: log}
}

func (q quietLogger) Debug(msg string, fields watermill.LogFields) {
	if q.log.Enabled(context.Background(), slog.LevelDebug) {
		q.LoggerAdapter.Debug(msg, fields)
	}
}

func (q quietLogger) Trace(msg string, fields watermill.LogFields) {
	if q.log.Enabled(context.Background(), watermill.LevelTrace) {
		q.LoggerAdapter.Trace(msg, fields)
	}
}

func (q quietLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return quietLogger{LoggerAdapter: q.LoggerAdapter.With(fields), log: q.log}
}
