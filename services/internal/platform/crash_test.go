package platform

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// TestCrashRoute: a failpoint build serves POST /debug/crash and refuses an
// unknown window with a reason; a default build has no such route at all.
// make test runs it in both builds.
func TestCrashRoute(t *testing.T) {
	mux := http.NewServeMux()
	crashRoute(mux, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("POST", "/debug/crash?window=no-such-window", nil))
	if !failpoint.Enabled {
		if rec.Code != http.StatusNotFound {
			t.Fatalf("default build: POST /debug/crash answered %d %q, want 404: no route", rec.Code, rec.Body)
		}
		rec = httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("POST", "/debug/crash?window=after-commit-before-ack", nil))
		if rec.Code != http.StatusNotFound {
			t.Fatalf("default build: arming a real window answered %d %q, want 404", rec.Code, rec.Body)
		}
		return
	}
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `unknown window "no-such-window"`) {
		t.Fatalf("failpoint build: an unknown window got %d %q, want 400 naming it", rec.Code, rec.Body)
	}
	// Armed and disarmed again; this test never reaches the window.
	for _, step := range []struct {
		method string
		code   int
		says   string
	}{
		{"GET", http.StatusMethodNotAllowed, ""},
		{"POST", http.StatusOK, "armed after-commit-before-ack"},
		{"DELETE", http.StatusOK, "disarmed after-commit-before-ack"},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(step.method, "/debug/crash?window=after-commit-before-ack", nil))
		if rec.Code != step.code || !strings.Contains(rec.Body.String(), step.says) {
			t.Fatalf("%s /debug/crash: %d %q, want %d %q", step.method, rec.Code, rec.Body, step.code, step.says)
		}
	}
}
