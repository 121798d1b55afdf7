//go:build failpoint

package platform

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// crashRoute serves POST /debug/crash?window=NAME in a failpoint build: it
// arms that crash window for this process's next hit (failpoint.Once), so
// the live demo's "crash it now" can kill a running service where it says;
// DELETE /debug/crash?window=NAME disarms it again (a lesson given up). A
// default build has no such route (crash_default.go).
func crashRoute(mux *http.ServeMux, log *slog.Logger) {
	mux.HandleFunc("POST /debug/crash", func(w http.ResponseWriter, r *http.Request) {
		window := failpoint.Name(r.URL.Query().Get("window"))
		if err := failpoint.Once(window); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		log.Warn("crash window armed: the next hit kills this process with SIGKILL", "window", window)
		fmt.Fprintf(w, "armed %s: this process is killed with SIGKILL at its next hit\n", window)
	})
	mux.HandleFunc("DELETE /debug/crash", func(w http.ResponseWriter, r *http.Request) {
		window := failpoint.Name(r.URL.Query().Get("window"))
		if !slices.Contains(failpoint.All, window) {
			http.Error(w, fmt.Sprintf("unknown crash window %q", window), http.StatusBadRequest)
			return
		}
		failpoint.Disarm(window)
		log.Info("crash window disarmed", "window", window)
		fmt.Fprintf(w, "disarmed %s\n", window)
	})
}
