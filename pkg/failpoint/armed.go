//go:build failpoint

package failpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Enabled reports whether this binary was built with the failpoint tag: only
// then can a window fire.
const Enabled = true

// schedule decides whether one hit of a window fires.
type schedule struct {
	every int64   // fire on every Nth hit, when > 0
	p     float64 // otherwise fire with this probability
	now   bool    // armed by Once: the grace period does not apply
	hits  atomic.Int64
}

var (
	armed     atomic.Bool
	tracing   atomic.Bool
	mu        sync.Mutex
	traced    map[Name]bool
	schedules map[Name]*schedule
	rng       *rand.Rand
	logPath   string
	armedAt   time.Time // no window fires before this instant
	logFile   *os.File
)

// FromEnv arms the windows the environment names (FAILPOINTS,
// FAILPOINT_SEED, FAILPOINT_LOG, FAILPOINT_GRACE, FAILPOINT_TRACE: see the
// package doc) and returns an error naming a malformed value. A program calls
// it once at start-up and refuses to start on its error; nothing in this
// package reads the environment on its own.
func FromEnv() error {
	if err := Configure(os.Getenv("FAILPOINTS"), os.Getenv("FAILPOINT_SEED"), os.Getenv("FAILPOINT_LOG")); err != nil {
		return err
	}
	if err := Trace(os.Getenv("FAILPOINT_TRACE")); err != nil {
		return err
	}
	if g := os.Getenv("FAILPOINT_GRACE"); g != "" {
		grace, err := time.ParseDuration(g)
		if err != nil {
			return fmt.Errorf("FAILPOINT_GRACE %q: %w", g, err)
		}
		mu.Lock()
		armedAt = time.Now().Add(grace)
		mu.Unlock()
	}
	return nil
}

// Configure arms the windows named in spec ("name=p:0.1,name=every:5").
// An empty spec disarms every window. FromEnv calls it with the
// environment's values; tests may call it directly.
func Configure(spec, seed, log string) error {
	parsed := map[Name]*schedule{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, rule, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("FAILPOINTS item %q: want name=p:0.1 or name=every:N", item)
		}
		if !known(Name(name)) {
			return fmt.Errorf("FAILPOINTS: unknown window %q (known: %v)", name, All)
		}
		kind, val, _ := strings.Cut(rule, ":")
		s := &schedule{}
		switch kind {
		case "p":
			p, err := strconv.ParseFloat(val, 64)
			if err != nil || p < 0 || p > 1 {
				return fmt.Errorf("FAILPOINTS %s: probability %q must be in [0,1]", name, val)
			}
			s.p = p
		case "every":
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n < 1 {
				return fmt.Errorf("FAILPOINTS %s: every %q must be a positive integer", name, val)
			}
			s.every = n
		default:
			return fmt.Errorf("FAILPOINTS %s: rule %q: want p:FLOAT or every:N", name, rule)
		}
		parsed[Name(name)] = s
	}
	var seedN uint64
	if seed != "" {
		n, err := strconv.ParseUint(seed, 10, 64)
		if err != nil {
			return fmt.Errorf("FAILPOINT_SEED %q: %w", seed, err)
		}
		seedN = n
	}
	mu.Lock()
	defer mu.Unlock()
	schedules = parsed
	rng = rand.New(rand.NewPCG(seedN, uint64(os.Getpid())))
	logPath = log
	armed.Store(len(parsed) > 0)
	return nil
}

// Trace makes every hit of the windows named in spec ("before-begin,
// after-commit-before-response") append a trace line to the log Configure
// was given; an empty spec traces nothing.
func Trace(spec string) error {
	names := map[Name]bool{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !known(Name(item)) {
			return fmt.Errorf("FAILPOINT_TRACE: unknown window %q (known: %v)", item, All)
		}
		names[Name(item)] = true
	}
	mu.Lock()
	defer mu.Unlock()
	if len(names) > 0 && logPath == "" {
		return errors.New("FAILPOINT_TRACE needs FAILPOINT_LOG: the trace has nowhere to go")
	}
	traced = names
	tracing.Store(len(names) > 0)
	return nil
}

func known(n Name) bool {
	for _, k := range All {
		if k == n {
			return true
		}
	}
	return false
}

// active reports whether any window is armed or traced: two atomic loads.
func active() bool { return armed.Load() || tracing.Load() }

// hit is Hit's work in a failpoint build, subject as the log writes it.
func hit(n Name, subject string) {
	mu.Lock()
	if traced[n] {
		appendLog(fmt.Sprintf("failpoint %s hit: pid %d subject %s\n", n, os.Getpid(), subject), false)
	}
	s := schedules[n]
	if !armed.Load() || s == nil || !s.now && time.Now().Before(armedAt) {
		mu.Unlock()
		return
	}
	fire := false
	if s != nil {
		hit := s.hits.Add(1)
		if s.every > 0 {
			fire = hit%s.every == 0
		} else {
			fire = rng.Float64() < s.p
		}
	}
	if fire {
		kill(n, subject) // with mu held since the hit's line: nothing comes between them
	}
	mu.Unlock()
}

// appendLog appends line to the log, in one write: every process of a run
// appends to the same file (O_APPEND), and the order of the lines is the
// order of the events. A kill line is synced, the process is about to die.
// mu must be held.
func appendLog(line string, sync bool) {
	if logPath == "" {
		return
	}
	if logFile == nil || logFile.Name() != logPath {
		if logFile != nil {
			logFile.Close() //nolint:errcheck // a log of an earlier Configure
		}
		logFile = nil
		f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return // best effort: a trace must never stop the process
		}
		logFile = f
	}
	logFile.WriteString(line) //nolint:errcheck // best effort, as above
	if sync {
		logFile.Sync() //nolint:errcheck
	}
}

// kill writes the kill line and kills the process. mu is held, taken by
// the hit that fired it, and never released: no other goroutine's hit can
// write a line
// between the window's hit line and the kill line, or after the kill line
// (the log shows the process's last step as the window it died in,
// chaos/model/trace), or fire a second kill.
//
// A process that is PID 1 of its own PID namespace (a container's
// entrypoint without an init) does not receive a SIGKILL it sends itself;
// it exits at once with SIGKILL's status instead, saying so, rather than
// live on with its windows locked.
func kill(n Name, subject string) {
	line := fmt.Sprintf("failpoint %s fired: SIGKILL pid %d subject %s\n", n, os.Getpid(), subject)
	appendLog(line, true)
	os.Stderr.WriteString(line)                                                                                                  //nolint:errcheck
	syscall.Kill(os.Getpid(), syscall.SIGKILL)                                                                                   //nolint:errcheck
	time.Sleep(time.Second)                                                                                                      // the kernel delivers it long before this
	os.Stderr.WriteString("failpoint: SIGKILL did not arrive (PID 1 of a namespace ignores its own); exiting with status 137\n") //nolint:errcheck
	os.Exit(137)
}

// Once arms window n to fire on its next hit, from now on, whatever the
// grace period (which still holds for the other windows), and leaves the
// other windows' schedules as they are. It is the live demo's "crash it
// now" (services/internal/platform serves it in a failpoint build only);
// the log Configure was given receives the kill line.
func Once(n Name) error {
	if !known(n) {
		return fmt.Errorf("failpoint: unknown window %q (known: %v)", n, All)
	}
	mu.Lock()
	defer mu.Unlock()
	next := make(map[Name]*schedule, len(schedules)+1)
	for k, v := range schedules {
		next[k] = v
	}
	next[n] = &schedule{every: 1, now: true}
	schedules = next
	if rng == nil {
		rng = rand.New(rand.NewPCG(0, uint64(os.Getpid())))
	}
	armed.Store(true)
	return nil
}

// Disarm removes window n's schedule, if it has one: a "crash it now" that
// was given up before its window was hit must not kill later.
func Disarm(n Name) {
	mu.Lock()
	defer mu.Unlock()
	next := make(map[Name]*schedule, len(schedules))
	for k, v := range schedules {
		if k != n {
			next[k] = v
		}
	}
	schedules = next
	armed.Store(len(next) > 0)
}
