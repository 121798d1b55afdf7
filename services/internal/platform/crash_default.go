//go:build !failpoint

package platform

import (
	"log/slog"
	"net/http"
)

// crashRoute adds nothing in a default build: no request can arm a crash
// window (see crash_failpoint.go).
func crashRoute(*http.ServeMux, *slog.Logger) {}
