package judge

import (
	"bufio"
	"io"
	"os"

	"github.com/outboxref/outbox-inbox/chaos/model/trace"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// Kill is one kill line of the failpoint log.
type Kill struct {
	Seq     int // line number: the log's order is the order of the events
	Window  failpoint.Name
	Pid     int
	Subject string
}

// Log is a run's failpoint log (FAILPOINT_LOG), read: its kills and, when
// asked for, its trace lines.
type Log struct {
	Kills []Kill
	hits  map[string][]hit // window + " " + subject → its trace lines
}

type hit struct{ seq, pid int }

// ReadLog reads the failpoint log at path as it is now (no file: no kill
// yet), the trace lines too when hits.
func ReadLog(path string, hits bool) (Log, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return Log{hits: map[string][]hit{}}, nil
	}
	if err != nil {
		return Log{}, err
	}
	defer f.Close()
	return ParseLog(f, hits)
}

// ParseLog reads the lines chaos/model/trace reads (trace.ParseLine), kills
// always, trace lines with hits. A trace line of no subject (a message
// without an id) names nothing a kill could be about, and is left out. A
// line ParseLine refuses (a torn or foreign line, a pid that is no pid) is
// skipped here, counted nowhere: CheckTrace fails the run on it
// (trace-in-model), so no verdict passes over it unseen.
func ParseLog(r io.Reader, hits bool) (Log, error) {
	l := Log{hits: map[string][]hit{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for seq := 0; sc.Scan(); seq++ {
		s, ok := trace.ParseLine(sc.Text())
		switch {
		case !ok:
		case s.Kill:
			l.Kills = append(l.Kills, Kill{Seq: seq, Window: failpoint.Name(s.Window), Pid: s.Pid, Subject: s.Subject})
		case hits && s.Subject != "":
			key := s.Window + " " + s.Subject
			l.hits[key] = append(l.hits[key], hit{seq, s.Pid})
		}
	}
	return l, sc.Err()
}

// seenAfter reports whether another process than the killed one traced
// k's subject at window w after the kill.
func (l Log) seenAfter(w failpoint.Name, k Kill) bool {
	for _, h := range l.hits[string(w)+" "+k.Subject] {
		if h.seq > k.Seq && h.pid != k.Pid {
			return true
		}
	}
	return false
}

// consumedAgain reports whether another consumer process took k's subject
// up after the kill: it began a delivery of it, or a delivery it had begun
// before (a copy two processes held at once, as in a rebalance) reached the
// inbox insert after the kill, its insert having waited for the killed
// transaction's to roll back.
func (l Log) consumedAgain(k Kill) bool {
	return l.seenAfter(failpoint.BeforeBegin, k) || l.seenAfter(failpoint.AfterInboxInsert, k)
}

// deliveries counts the deliveries of message id any consumer began.
func (l Log) deliveries(id string) int {
	return len(l.hits[string(failpoint.BeforeBegin)+" "+id])
}
