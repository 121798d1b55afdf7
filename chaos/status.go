package main

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"sync"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// statusPath is where a run writes its live status every second, for the
// dashboard (go run ./cmd/dashboard -chaos-status PATH). The field names are
// those of Report, which replaces the status when the run ends, so the
// dashboard shows the verdict too.
var statusPath = flag.String("status", "", "write a live JSON status here every second (for cmd/dashboard -chaos-status)")

// status is what the file holds while the run goes on.
type status struct {
	UpdatedAt        time.Time         `json:"updated_at"`
	Phase            string            `json:"phase"` // load, then draining
	Seed             uint64            `json:"seed"`
	Profile          string            `json:"profile"`
	Inbox            bool              `json:"inbox"`
	Kills            map[string]int    `json:"kills"` // crash window → SIGKILLs so far
	RandomKills      int               `json:"random_kills"`
	TotalKills       int               `json:"total_kills"`
	Restarts         int               `json:"restarts"`
	PostgresRestarts int               `json:"postgres_restarts"`
	BrokerFaults     map[string]int    `json:"broker_faults"`
	Databases        map[string]string `json:"databases"` // service → URL, for the dashboard
}

// statusMu orders the writes, so the live writer cannot overwrite the final
// report once it is written.
var (
	statusMu   sync.Mutex
	statusDone bool
)

// writeStatus writes the live status every second until ctx ends or the
// final report is written. Call it once h.sys and h.faults are set.
func (h *harness) writeStatus(ctx context.Context) {
	if *statusPath == "" {
		return
	}
	h.say("live status in %s: go run ./cmd/dashboard -orders-db '%s' -inventory-db '%s' -chaos-status %s",
		*statusPath, h.sys.DBURL["orders"], h.sys.DBURL["inventory"], *statusPath)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		fired := h.readFired()
		h.mu.Lock()
		phase := "load"
		if h.draining {
			phase = "draining"
		}
		h.mu.Unlock()
		s := status{
			UpdatedAt: time.Now(), Phase: phase, Seed: h.seed, Profile: h.p.Name, Inbox: h.inbox,
			Kills: map[string]int{}, RandomKills: int(h.randomKills.Load()), Restarts: int(h.restarts.Load()),
			PostgresRestarts: int(h.pgRestarts.Load()), BrokerFaults: h.faults.counts(), Databases: h.sys.DBURL,
		}
		s.TotalKills = s.RandomKills
		for _, w := range failpoint.All {
			s.Kills[string(w)] = fired[w]
			s.TotalKills += fired[w]
		}
		if !writeStatusFile(s, false) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// writeFinalStatus replaces the live status with the final report.
func writeFinalStatus(r *Report) {
	if *statusPath != "" && r != nil {
		writeStatusFile(r, true)
	}
}

// writeStatusFile writes v atomically (a rename), unless the final report
// was written already; it reports whether the live writer should go on.
func writeStatusFile(v any, final bool) bool {
	statusMu.Lock()
	defer statusMu.Unlock()
	if statusDone {
		return false
	}
	statusDone = final
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return true
	}
	tmp := *statusPath + ".tmp"
	if os.WriteFile(tmp, append(data, '\n'), 0o644) == nil {
		os.Rename(tmp, *statusPath) //nolint:errcheck // the next tick tries again
	}
	return true
}
