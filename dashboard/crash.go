package dashboard

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/outboxref/outbox-inbox/services/runtime/strictjson"
)

// Crasher is the live demo's "crash it now" (dashboard/crashnow): it arms one
// crash window in a running service for its next message, sends an order
// through, restarts the killed process, and tells what happened, one step at
// a time. Only the demo, whose services are failpoint builds, has one.
type Crasher interface {
	// Windows are the windows it can arm, in the order a message meets them.
	Windows() []CrashWindow
	// Crash starts a lesson at window; ErrLessonRunning while one runs.
	Crash(window string) error
	// Lesson is the latest lesson, running or done; nil before the first.
	Lesson() *Lesson
}

// crashHeader must be on POST /crash: a cross-site form cannot send it.
const crashHeader = "X-Crash-It-Now"

// ErrLessonRunning refuses a second crash while a lesson runs.
var ErrLessonRunning = errors.New("a crash lesson is running: wait for it to finish")

// CrashWindow is one window the page offers.
type CrashWindow struct {
	Name   string `json:"name"`
	Victim string `json:"victim"` // the service killed there
	Where  string `json:"where"`  // one line: what is true at that moment
}

// Lesson is one crash and what followed it.
type Lesson struct {
	ID      int          `json:"id"`
	Window  string       `json:"window"`
	Victim  string       `json:"victim"`
	Order   string       `json:"order,omitempty"`
	Message string       `json:"message,omitempty"` // the message the killed code was working on
	Steps   []LessonStep `json:"steps"`
	Done    bool         `json:"done"`
	Failed  string       `json:"failed,omitempty"`
}

// LessonStep is one sentence of a lesson.
type LessonStep struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"` // armed, paid, killed, restarted, redelivered, suppressed, applied, settled, retried
	Text string    `json:"text"`
}

// picture is what the page's script draws, sent with every update.
type picture struct {
	At      int64         `json:"at"` // unix ms
	Flow    Flow          `json:"flow"`
	Lesson  *Lesson       `json:"lesson,omitempty"`
	Windows []CrashWindow `json:"windows,omitempty"`
}

func (s *Server) picture(snap Snapshot) picture {
	p := picture{At: snap.At.UnixMilli(), Flow: snap.Flow}
	if s.opts.Crash != nil {
		p.Lesson, p.Windows = s.opts.Crash.Lesson(), s.opts.Crash.Windows()
	}
	return p
}

// crashRoutes serves POST /crash ({"window": name}) when Options.Crash is
// set; without it there is no such route.
func (s *Server) crashRoutes(mux *http.ServeMux) {
	if s.opts.Crash == nil {
		return
	}
	mux.HandleFunc("POST /crash", func(w http.ResponseWriter, r *http.Request) {
		// A page of another site may POST a form here, but it cannot set
		// this header without a CORS preflight, which nothing answers.
		if r.Header.Get(crashHeader) != "1" {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "POST /crash needs the header " + crashHeader + ": 1 (the page sends it)"})
			return
		}
		var req struct {
			Window string `json:"window"`
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<10))
		if err == nil {
			err = strictjson.Decode(body, &req)
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `POST /crash takes {"window": "<name>"}: ` + err.Error()})
			return
		}
		window := req.Window
		known := false
		for _, cw := range s.opts.Crash.Windows() {
			known = known || cw.Name == window
		}
		if !known {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unknown crash window " + quote(window)})
			return
		}
		err = s.opts.Crash.Crash(window)
		switch {
		case errors.Is(err, ErrLessonRunning):
			writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		default:
			writeJSON(w, http.StatusAccepted, map[string]string{"window": window})
		}
	})
}

// quote is s for an error message: quoted, cut at 64 bytes.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strconv.Quote(s)
}
